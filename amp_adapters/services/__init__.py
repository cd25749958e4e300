"""amp_adapters.services: what serves the policy kernel and the user.

Measured speed (the book, the speed source, the measuring child, timing), memory,
reports, checkpoints, the doctor and the command: they use the kernel (``amp_adapters.rules``),
never the reverse.

Files:

    speedbook.py  measured speed kept: saved profiles, the per-machine cache, measuring
    speed_source.py  SpeedSource: what a runtime supplies to be timed (a Job, a timer,
                  its child module); the book, the lookup and the job server per source
    timing.py     side-by-side timing: interleaved pairs, median ratio and spread
    measure_process.py  measurements in a kept child process (the planning process untouched)
    device_book.py  a backend's answers about this machine's kernels: asked in that child, kept
    memory.py     a step's peak memory: a fresh process per run, VmHWM, median of three
    batch_fit.py  the largest batch in a memory budget: a line through measured peaks
    speed_report.py  info --measure / profile: per-op measured speed, the saved profile
    checkpoint.py atomic, verified checkpoint folders (the backends' save/load_checkpoint)
    report.py     CastReport: decisions per op and the graph's casts; print(report) is the table
    fallback.py   what a backend says about ops without a low-precision kernel here
    native_speed.py  the one line when the native's decisions are slower than float32 here
    quiet.py      framework log noise off, for our command and examples
    cli.py        ``amp-adapters lists|explain|diff`` (other subcommands come by entry point)
    native_diff.py  where the shared O1 and each native default disagree, and why
    doctor/       the numerics doctor's core: range stats, findings, the recommended policy TOML
"""
