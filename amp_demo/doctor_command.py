"""The ``doctor`` subcommand: run the numerics doctor on a demo model with a planted problem.

    amp-adapters doctor --framework mxnet|paddle|paddle-dygraph --model overflow [--steps 2]
                        [--write fix.toml]

Trains the model for ``--steps`` steps under the policy (default: O1 fp16, emulated where
the device has no fp16 kernel) inside ``mxnet_amp.doctor`` / ``paddle_amp.doctor`` /
``paddle_amp.dygraph.doctor``, prints
the report and the recommended policy file, and with ``--write`` saves that file.
``amp_demo.command.register`` (the ``demo`` entry point of ``amp_adapters.commands``) adds it.
"""
from __future__ import annotations

import argparse
import importlib
from typing import Optional

from amp_adapters.services.cli import positive_steps
from amp_adapters import resolve_policy
from amp_adapters.services.quiet import quiet_frameworks

from . import doctor_models as M

HELP = "examine a demo model with a planted fp16 problem: which op, and the policy that fixes it"


def run(args: argparse.Namespace) -> int:
    policy = resolve_policy(args.policy) if args.policy else M.policy(args.model)
    quiet_frameworks()
    trainer = importlib.import_module(f"amp_demo.{args.framework.replace('-', '_')}_trainer")
    report, rec = trainer.run_doctor(args.model, policy, args.steps)
    print(report.format())
    print("\n" + rec.format())
    print("\nrecommended policy (pass it as policy= unchanged):\n")
    print(rec.toml)
    if args.write:
        rec.write(args.write)
        print(f"written to {args.write}")
    return 0


def register(subparsers: "argparse._SubParsersAction") -> Optional[argparse.ArgumentParser]:
    """Add ``doctor`` to the ``amp-adapters`` subcommands."""
    p = subparsers.add_parser("doctor", help=HELP, description=HELP)
    p.add_argument("--framework", default="mxnet",
                   choices=("mxnet", "paddle", "paddle-dygraph"),
                   help="which backend's doctor runs the planted model (default: mxnet; "
                        "paddle: a static program, paddle-dygraph: eager layers)")
    p.add_argument("--model", default="overflow", choices=M.KINDS,
                   help="the planted problem: an fp16 overflow in a matmul, gradients that "
                        "underflow at the default loss scale, a precision-sensitive reduction")
    p.add_argument("--steps", type=positive_steps, default=2, help="steps to examine")
    p.add_argument("--policy", metavar="POLICY", help="a preset name or a TOML policy file "
                   "(default: O1 fp16, emulated where there is no fp16 kernel)")
    p.add_argument("--write", metavar="FILE", help="save the recommended policy file here")
    p.set_defaults(handler=run)
    return p
