"""Testing a team's own pipeline with pytest: the `episodic` pytest plugin and its helpers.

Installing episodic registers the plugin (`episodic.testing.plugin`, the ``pytest11`` entry
point); it only adds fixtures, each named ``episodic_…``, and changes nothing for a test that
asks for none. docs/testing-your-pipeline.md is the guide.

- `episodic.testing.sandbox`: a state folder of its own, a week planned, generated, approved
  and assembled through the command line in-process, its spend and its jobs per item;
- `episodic.testing.fake_jobs`: what the fake provider made, read from its own log (counted
  where money is spent, never from episodic's tables), and the faults a test puts in a
  playlist to rehearse a bad week;
- `episodic.testing.postgres`: fresh PostgreSQL databases copied from a migrated template.
"""
