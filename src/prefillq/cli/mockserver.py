"""``python -m prefillq.cli.mockserver``: the mock OpenAI-compatible server as its own process.

The server is :mod:`prefillq.bench.mockserver`; this is only its command line (``prefillq bench
--launch mock`` starts one per policy this way, with ``--engine-policy``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys

from prefillq.bench.mockserver import MockBehaviour, serve_forever


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
    parser.add_argument("--tokens-per-chunk", type=int, default=1)
    parser.add_argument("--engine-policy", default=None,
                        help="serve on the simulated vLLM engine with this policy (a name or JSON config)")
    parser.add_argument("--engine-profile", default=None, help="cost profile (default: compare's vLLM-mode default)")
    parser.add_argument("--engine-limits", default="{}", help="JSON object of engine limits, e.g. "
                        '\'{"max_num_batched_tokens": 256}\'')
    parser.add_argument("--fault", action="append", default=[], metavar="REQUEST_ID=FAULT")
    args = parser.parse_args(argv)
    try:
        faults = dict(item.split("=", 1) for item in args.fault)
        limits = json.loads(args.engine_limits)
        if not isinstance(limits, dict):
            raise ValueError("--engine-limits must be a JSON object")
        behaviour = MockBehaviour(
            model=args.model, vocab_size=args.vocab_size, first_token_delay_s=args.first_token_delay_s,
            prefill_token_s=args.prefill_token_s, token_interval_s=args.token_interval_s,
            tokens_per_chunk=args.tokens_per_chunk, engine_policy=args.engine_policy,
            **({} if args.engine_profile is None else {"engine_profile": args.engine_profile}),
            engine_limits=limits, faults=faults, record_requests=False,
        )
    except ValueError as exc:  # ConfigError and ProfileError are ValueErrors too
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)

    def announce(url: str) -> None:
        print(f"mock server listening on {url}", flush=True)
        if behaviour.engine_policy is not None:
            from prefillq.bench.simengine import EngineDriver

            driver = EngineDriver(behaviour.engine_policy, behaviour.engine_profile, behaviour.engine_limits)
            print(f"serving on the simulated vLLM engine: waiting queue policy {driver.policy_name}, profile "
                  f"{behaviour.engine_profile}, limits {driver.engine_limits}", flush=True)

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve_forever(behaviour, args.host, args.port, announce))
    sys.exit(0)


if __name__ == "__main__":
    main()
