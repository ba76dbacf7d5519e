"""`python -m episodic`: the `episodic` command."""

from episodic.cli.entry import main

if __name__ == "__main__":
    main()
