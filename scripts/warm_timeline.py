"""`kprecompile warm -v`, each log line stamped with the seconds since this process started: where a
warm's time goes (imports, tracing per family, compiling, the manifest).

    python scripts/warm_timeline.py --model deepseek-r1 --tp 8 --target gfx942 --cache-dir /tmp/empty
"""

import logging
import sys
import time

t0 = time.perf_counter()


class Stamped(logging.Formatter):
    def format(self, record):
        return f"{time.perf_counter() - t0:6.2f} {super().format(record)}"


if __name__ == "__main__":
    from kprecompile.cli import main

    print(f"{time.perf_counter() - t0:6.2f} imported the CLI", flush=True)
    original = logging.basicConfig

    def stamped(**kwargs):
        original(**kwargs)
        for handler in logging.getLogger().handlers:
            handler.setFormatter(Stamped("%(name)s: %(message)s"))

    logging.basicConfig = stamped
    try:
        main(["warm", "-v", *sys.argv[1:]])
    except SystemExit as exited:
        print(f"{time.perf_counter() - t0:6.2f} exit {exited.code}", flush=True)
