"""MkDocs hook: publish bench/RESULTS.md and its figures with the docs, from where they live
(``make bench`` rewrites them there), so the benchmark page links them without copies."""
from __future__ import annotations

import os

from mkdocs.structure.files import File, Files

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FROM_THE_CHECKOUT = ["bench/RESULTS.md", "bench/figures/loss_scaling_claim.png",
                     "bench/figures/claim_families.png"]


def on_files(files: Files, config) -> Files:
    for path in FROM_THE_CHECKOUT:
        files.append(File(path, src_dir=ROOT, dest_dir=config["site_dir"],
                          use_directory_urls=config["use_directory_urls"]))
    return files
