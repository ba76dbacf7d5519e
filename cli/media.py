"""`episodic media restore|import|restore-marker`: what was paid for is put back in the
media store, free; a store that lost its marker is proven the database's and marked again.

Exit codes: 0 every image (or legacy file) is in the store; 1 some are not (each listed
with why); 2 refused (a malformed id or a store that cannot be written: before anything is
written; a provider profile or credential: before any provider call); 5 no such episode;
130 interrupted.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Annotated, Any

import typer

from episodic.cli import context
from episodic.cli.options import JsonOption, PipelineOption, StrictInt
from episodic.cli.output import emit_json, one_line
from episodic.cli.signals import interrupts

if TYPE_CHECKING:
    from episodic.pipeline.restore import RestoreReport

_Start = Callable[[int], None]
_Advance = Callable[[], None]
app = typer.Typer(
    help="The media store: restore lost images, import legacy files.", no_args_is_help=True
)


@contextmanager
def _progress(
    as_json: bool, what: str
) -> Iterator[tuple[Callable[[int], None], Callable[[], None]]]:
    """(start(total), advance()) of a transient progress bar on a terminal; silent for
    --json and for pipes."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    console = Console(stderr=True)
    shown: list[tuple[Progress, Any]] = []

    def start(total: int) -> None:
        if as_json or not console.is_terminal or total == 0:
            return
        bar = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            console=console,
            transient=True,
        )
        bar.start()
        shown.append((bar, bar.add_task(what, total=total)))

    def advance() -> None:
        for bar, task in shown:
            bar.advance(task)

    try:
        yield start, advance
    finally:
        for bar, _ in shown:
            bar.stop()


@app.command("restore")
def restore(
    episode_id: Annotated[str, typer.Argument(help="Episode id, e.g. 2026-W32-0 (must exist).")],
    collect_timeout: Annotated[
        int,
        typer.Option(
            click_type=StrictInt(1, 86400),
            help="Seconds to keep trying to download one image from its provider job before "
            "reporting it not served.",
        ),
    ] = 60,
    buy_again: Annotated[
        bool,
        typer.Option(
            "--buy-again",
            help="Buy again, as a new paid call, each image the provider no longer serves "
            "(the cost is shown first; asks on a terminal, else needs --yes).",
        ),
    ] = False,
    yes: Annotated[
        bool, typer.Option("--yes", help="With --buy-again: buy without asking.")
    ] = False,
    max_images: Annotated[
        int | None,
        typer.Option(click_type=StrictInt(0), help="With --buy-again: buy at most this many."),
    ] = None,
    max_cost: Annotated[
        str | None, typer.Option(help="With --buy-again: refuse above this amount, e.g. 5.00.")
    ] = None,
    pipeline: PipelineOption = None,
    as_json: JsonOption = False,
) -> None:
    """Put every completed image of EPISODE_ID back in the media store, paying nothing.

    An image missing from the store, or whose bytes there are not the recorded ones, is
    downloaded again from the provider's recorded job (no new job), proven an image and
    stored only if its sha256 is the recorded one. Bytes that differ are refused and
    reported (the recorded image stands); a job the provider no longer serves is reported,
    and with --buy-again bought again (a normal paid run, capped, the cost shown first).
    Exit 0: every image is in the store; 1: some are not; 2: refused; 5: no such episode.
    """
    from episodic.pipeline.restore import restore as restore_episode
    from episodic.tasks.credentials import CommandLineCredentials

    if not buy_again and (yes or max_images is not None or max_cost is not None):
        from episodic.core.errors import InvalidInput

        raise InvalidInput("--yes, --max-images and --max-cost go with --buy-again")
    stop = threading.Event()
    interrupts.on_signal(stop.set)
    if buy_again:
        _buy_again(episode_id, collect_timeout, yes, max_images, max_cost, pipeline, as_json, stop)
        return
    with _progress(as_json, f"restoring {episode_id}") as (start, advance):
        report = restore_episode(
            context.engine(),
            context.settings(),
            context.pipeline_name(pipeline),
            episode_id,
            CommandLineCredentials(),
            collect_timeout_s=float(collect_timeout),
            stop=stop,
            on_plan=start,
            on_item=lambda _item: advance(),
        )
    if as_json:
        emit_json(report.to_dict())
    else:
        _print_restore(report)
        lost = report.not_served_cost()
        if lost:
            from episodic.core.money import format_money

            priced = " + ".join(format_money(minor, cur) for cur, minor in sorted(lost.items()))
            typer.echo(
                f"the images not served cost {priced} when they were bought; "
                f"`episodic media restore {report.episode_id} --buy-again` buys them again"
            )
    raise typer.Exit(0 if report.complete else 1)


def _print_restore(report: RestoreReport, pending: list[str] | None = None) -> None:
    """`pending`: items recorded lost and not bought again yet (none is in the store)."""
    for item in report.items:
        detail = f": {one_line(item.detail, 300)}" if item.detail else ""
        typer.echo(f"{item.item_id}: {item.status.replace('_', ' ')}{detail}")
    counts = ", ".join(f"{n} {s.replace('_', ' ')}" for s, n in sorted(report.counts().items()))
    verdict = "every image is in the store" if report.complete else "not every image"
    if pending:
        verdict = (
            f"{len(pending)} image{'' if len(pending) == 1 else 's'} pending (recorded lost, "
            f"not bought again yet: {', '.join(pending)})"
        )
    typer.echo(
        f"episode {report.episode_id} in {report.store}: {counts or 'no completed images'}"
        f"; {verdict}; {report.collected} downloads from recorded jobs, 0 paid calls"
    )


def _buy_again(
    episode_id: str,
    collect_timeout: int,
    yes: bool,
    max_images: int | None,
    max_cost: str | None,
    pipeline: str | None,
    as_json: bool,
    stop: threading.Event,
) -> None:
    """`media restore --buy-again`: the free restore, then the quote (on stderr), asked on
    a terminal or taken with --yes (else refused, exit 2), then the paid run."""
    import sys

    from episodic.core.errors import CommandNotAllowed
    from episodic.core.money import parse_money
    from episodic.core.planning import RunOptions
    from episodic.pipeline.buy_again import Quote, buy_again
    from episodic.tasks.credentials import CommandLineCredentials

    settings = context.settings()

    def confirm(quote: Quote) -> bool:
        if yes:
            typer.echo(quote.describe(), err=True)
            return True
        if not sys.stdin.isatty():
            raise CommandNotAllowed(
                f"{quote.describe()}: pass --yes to buy them (not a terminal to ask on); "
                "nothing was bought"
            )
        return typer.confirm(f"{quote.describe()}. Buy them again?", default=False, err=True)

    options = RunOptions(
        max_images=max_images,
        max_cost_micros=parse_money(max_cost) if max_cost is not None else None,
        lease_s=settings.lease_s,
        cap_micros=settings.max_run_cost_micros,
    )
    with _progress(as_json, f"restoring {episode_id}") as (start, advance):
        report = buy_again(
            context.engine(),
            settings,
            context.pipeline_name(pipeline),
            episode_id,
            CommandLineCredentials(),
            options,
            confirm,
            collect_timeout_s=float(collect_timeout),
            stop=stop,
            on_plan=start,
            on_item=lambda _item: advance(),
        )
    interrupts.mark_reported()
    if as_json:
        emit_json(report.to_dict())
    else:
        _print_restore(report.restore, report.pending)
        if report.earlier_plan:
            typer.echo(f"not bought again (from an earlier plan): {', '.join(report.earlier_plan)}")
        if report.outcome is not None:
            from episodic.core.money import format_money

            counts = report.outcome.counts
            cost = format_money(counts.cost_micros, counts.currency)
            typer.echo(
                f"bought again: {report.outcome.message}; the run's paid submissions "
                f"{counts.paid_submissions}, cost {cost}"
            )
    if report.outcome is not None and report.outcome.exit_code != 0:
        raise typer.Exit(int(report.outcome.exit_code))
    raise typer.Exit(0 if report.complete else 1)


@app.command("import")
def import_media(
    source: Annotated[
        str | None,
        typer.Option(
            "--from",
            help="Move to the configured media store on purpose: copy every recorded object "
            "from this store (the one the database records), then record the configured one.",
        ),
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """Copy every legacy local file the database names into the configured media store
    (with --from URL: move every recorded object from that store to the configured one).

    Rows from before the store record an absolute path; each file is checked against its
    recorded sha256, proven an image (a manifest: a document), stored and verified, and only
    then the row records its key and forgets the path. Pays nothing; a second run does
    nothing. A missing or changed file is reported, not fatal. Legacy files are not deleted.
    Exit 0: every legacy file was imported (or there was none); 1: some were not; 2: the
    store cannot be written (or is not the database's recorded store).
    """
    if source is not None:
        _move(source, as_json)
        return
    from episodic.pipeline.media_import import import_legacy_media

    with _progress(as_json, "importing legacy media") as (start, advance):
        report = import_legacy_media(
            context.engine(), context.settings(), on_plan=start, on_file=lambda _f: advance()
        )
    if as_json:
        emit_json(report.to_dict())
    else:
        for f in report.files:
            detail = f": {one_line(f.detail, 300)}" if f.detail else ""
            where = f" -> {f.key}" if f.key else f" ({one_line(f.path, 200)})"
            typer.echo(f"{f.episode_id} {f.what}: {f.status.replace('_', ' ')}{where}{detail}")
        if not report.files:
            typer.echo(f"nothing to import: no legacy files; the store is {report.store}")
        else:
            counts = ", ".join(
                f"{n} {s.replace('_', ' ')}" for s, n in sorted(report.counts().items())
            )
            typer.echo(f"{len(report.files)} legacy files into {report.store}: {counts}")
    raise typer.Exit(0 if report.complete else 1)


def _move(source: str, as_json: bool) -> None:
    from episodic.pipeline.store_move import move_store

    with _progress(as_json, "copying media") as (start, advance):
        report = move_store(
            context.engine(),
            context.settings(),
            source,
            on_plan=start,
            on_object=lambda _o: advance(),
        )
    if as_json:
        emit_json(report.to_dict())
    else:
        for o in report.objects:
            if o.status != "copied":
                typer.echo(f"{o.key}: {o.status.replace('_', ' ')}: {one_line(o.detail, 300)}")
        counts = ", ".join(f"{n} {s.replace('_', ' ')}" for s, n in sorted(report.counts().items()))
        done = (
            f"the database now records {report.store}"
            if report.moved
            else f"nothing recorded: the database still records {report.source}; run it again"
        )
        typer.echo(
            f"{len(report.objects)} objects from {report.source} to {report.store}"
            f"{': ' + counts if counts else ''}; {done}"
        )
    raise typer.Exit(0 if report.moved else 1)


@app.command("restore-marker")
def restore_marker(
    sample: Annotated[
        int,
        typer.Option(
            click_type=StrictInt(1, 1_000_000),
            help="How many recorded objects to check in the store (spread over all of them).",
        ),
    ] = 20,
    as_json: JsonOption = False,
) -> None:
    """Write the media store's lost marker (episodic-store.json) again, after proving the
    store is this database's: the configured store must be at the recorded address and
    hold a sample of the recorded objects with their recorded sha256. Pays nothing; writes
    nothing else. Exit 0: the marker is there (written, or it already was); 2: refused
    (nothing recorded, another address, another store's marker, or a sampled object
    missing or changed: nothing was written)."""
    from episodic.core.errors import CommandNotAllowed
    from episodic.storage.media import MediaStore
    from episodic.storage.store_identity import restore_marker as restore

    engine = context.engine()
    store = MediaStore.from_settings(context.settings())
    store.check_root()
    report = restore(engine, store, sample)
    if report.problems:
        shown = ", ".join(f"{key}: {why}" for key, why in report.problems[:3])
        more = ", ..." if len(report.problems) > 3 else ""
        raise CommandNotAllowed(
            f"media store {report.store}: {len(report.problems)} of {len(report.sampled)} "
            f"sampled recorded objects are not there as recorded ({shown}{more}): it is not "
            "this database's store, or it lost images; nothing was written"
        )
    if as_json:
        emit_json(report.to_dict())
        return
    if report.written:
        typer.echo(
            f"media store {report.store}: {len(report.sampled)} of {report.recorded} recorded "
            "objects checked, each with its recorded sha256; its marker is written again"
        )
    else:
        typer.echo(f"media store {report.store}: its marker is there; nothing to do")
