"""``python -m prefillq.cli.mockserver``: the mock OpenAI-compatible server as its own process.

The server is :mod:`prefillq.bench.mockserver`; this is only its command line (``prefillq bench
--launch mock`` starts one per policy this way).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys

from prefillq.bench.mockserver import QUEUE_POLICIES, MockBehaviour, serve_forever


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m prefillq.cli.mockserver",
        description="A small OpenAI-compatible streaming server for testing the load generator without an engine.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000, help="0 picks a free port (printed on stdout)")
    parser.add_argument("--model", default="mock-model")
    parser.add_argument("--vocab-size", type=int, default=32000)
    parser.add_argument("--first-token-delay-s", type=float, default=0.0)
    parser.add_argument("--prefill-token-s", type=float, default=0.0)
    parser.add_argument("--token-interval-s", type=float, default=0.0)
    parser.add_argument("--queue-policy", choices=QUEUE_POLICIES, default=None)
    parser.add_argument("--fault", action="append", default=[], metavar="REQUEST_ID=FAULT")
    args = parser.parse_args(argv)
    faults = dict(item.split("=", 1) for item in args.fault)
    behaviour = MockBehaviour(
        model=args.model, vocab_size=args.vocab_size, first_token_delay_s=args.first_token_delay_s,
        prefill_token_s=args.prefill_token_s, token_interval_s=args.token_interval_s,
        queue_policy=args.queue_policy, faults=faults, record_requests=False,
    )

    def announce(url: str) -> None:
        print(f"mock server listening on {url}", flush=True)

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve_forever(behaviour, args.host, args.port, announce))
    sys.exit(0)


if __name__ == "__main__":
    main()
