"""The `swiftspec` command: thin wrappers that parse flags, call library functions, print.

Each verb lives in its own section below. Bad input raises `UserError` anywhere below; `main`
turns it into one line on stderr and exit code 2 (no traceback).
"""

from __future__ import annotations

import sys

import click

from swiftspec.spec import UserError


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(package_name="swiftspec")
def cli() -> None:
    """swiftspec: plan, run and study disaggregated asynchronous speculative decoding.

    \b
      swiftspec plan --gpus 8          pick split, mode and tree by SimPy simulation (no GPU needed)
      swiftspec simulate --plan P      re-predict one plan
      swiftspec generate ...           single-process decoding (autoregressive/chain/serial)
      swiftspec profile ...            measure latencies and acceptance
      swiftspec run --plan P           run a plan with the asynchronous runtime
      swiftspec study NAME             draw a figure
    """


def main() -> None:
    try:
        cli.main(standalone_mode=False)
    except UserError as e:
        click.echo(f"error: {e}", err=True)
        sys.exit(2)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        sys.exit(130)
    except click.ClickException as e:
        e.show()
        sys.exit(2 if isinstance(e, click.UsageError) else e.exit_code)
    except click.exceptions.Exit as e:
        sys.exit(e.exit_code)
    except KeyboardInterrupt:
        click.echo("interrupted", err=True)
        sys.exit(130)


# ---- plan / simulate (swiftspec.sim) ------------------------------------------------------

# ---- generate (swiftspec.runtime) ----------------------------------------------------------

# ---- profile (swiftspec.profiler) ----------------------------------------------------------

# ---- run (swiftspec.runtime async engine) --------------------------------------------------

# ---- study / validate (studies/) -----------------------------------------------------------
