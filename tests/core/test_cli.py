"""The amp-adapters command, run as a user runs it (a subprocess of the console script)."""
import argparse
import os
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import amp_adapters
from amp_adapters import AmpConfigError
from amp_adapters.services.cli import _attr, main
from amp_demo import command

DEMO = {"demo": command.register}  # the subcommand amp_demo installs (entry point)

EXE = os.path.join(os.path.dirname(sys.executable), "amp-adapters")


def run(*args):
    return subprocess.run([EXE, *args], capture_output=True, text=True, timeout=120)


def test_lists_prints_every_category(capsys):
    assert main(["lists", "--framework", "mxnet", "--dtype", "float16"]) == 0
    out = capsys.readouterr().out
    for header in ("[lower]", "[fp32]", "[promote]", "[follow]"):
        assert header in out
    lower = out.split("[lower]")[1].split("[fp32]")[0]
    assert "FullyConnected  (linear)" in lower and "softmax" not in lower


def test_lists_follow_a_policy_file(tmp_path, capsys):
    path = tmp_path / "p.toml"
    path.write_text('[ops]\nlower = ["softmax"]\nfp32 = ["matmul"]\n')
    assert main(["lists", "--framework", "paddle", "--policy", str(path)]) == 0
    out = capsys.readouterr().out
    lower = out.split("[lower]")[1].split("[fp32]")[0]
    fp32 = out.split("[fp32]")[1].split("[promote]")[0]
    assert "  softmax" in lower and "  matmul_v2  (matmul)" in fp32


def test_explain_says_category_and_why():
    r = run("explain", "Activation", "--framework", "mxnet", "--attr", "act_type=softrelu",
            "--policy", "O1")
    assert r.returncode == 0, r.stderr
    assert "canonical: softplus" in r.stdout and "category: fp32" in r.stdout
    assert "why: canonical op 'softplus' is fp32 by default for float16" in r.stdout


def test_explain_unknown_op_is_an_error_with_close_matches():
    r = run("explain", "softmx", "--framework", "paddle")
    assert r.returncode == 2
    assert "unknown op 'softmx'" in r.stderr and "'softmax'" in r.stderr


def test_bad_policy_file_is_a_clean_error(tmp_path):
    path = tmp_path / "p.toml"
    path.write_text("levl = 'O1'")
    r = run("lists", "--framework", "mxnet", "--policy", str(path))
    assert r.returncode == 2 and "'levl'" in r.stderr and "Traceback" not in r.stderr


# -- user errors: one line, exit 2, no traceback, before any training -------------------------

USER_ERRORS = {
    "attr without =": (["explain", "Activation", "--framework", "mxnet", "--attr", "act_type"],
                       "--attr"),
    "zero steps": (["demo", "--steps", "0"], "--steps"),
    "negative steps": (["demo", "--steps", "-5"], "--steps"),
    "steps not a number": (["demo", "--steps", "ten"], "--steps"),
    "plot in a missing directory": (["demo", "--plot", "nodir/x.png"], "does not exist"),
    "plot not an image": (["demo", "--plot", "x.txt"], ".png"),
    "missing policy file": (["lists", "--framework", "mxnet", "--policy", "BADFILE"],
                            "'BADFILE' does not exist"),
    "policy is a directory": (["lists", "--framework", "mxnet", "--policy", "."], "directory"),
    "missing --framework": (["lists"], "--framework"),
    "unknown command": (["bogus"], "bogus"),
    "unknown framework": (["lists", "--framework", "torch"], "torch"),
    "empty policy": (["lists", "--framework", "mxnet", "--policy", ""], "--policy"),
    "blank policy for explain": (["explain", "dot", "--framework", "paddle", "--policy", " "],
                                 "--policy"),
    "diff of an unknown version": (["diff", "--framework", "mxnet", "--version", "0.0.1"],
                                   "known versions: 1.9.1"),
    "diff of a version the data lacks": (["diff", "--framework", "paddle", "--version", "3.2.2"],
                                         "known versions: 2.6.2, 3.3.1"),
}


@pytest.mark.parametrize("case", sorted(USER_ERRORS))
def test_user_errors_are_one_line_and_exit_2(case, tmp_path, capsys):
    argv, needle = USER_ERRORS[case]
    cwd = os.getcwd()
    os.chdir(tmp_path)  # relative paths resolve in an empty directory
    try:
        with pytest.raises(SystemExit) as exc:
            raise SystemExit(main(argv, commands=DEMO))
    finally:
        os.chdir(cwd)
    err = capsys.readouterr().err
    assert exc.value.code == 2
    assert err.startswith("amp-adapters: error: ") and err.count("\n") == 1, err
    assert needle in err and "Traceback" not in err


def test_user_errors_are_caught_before_training(tmp_path, capsys):
    """A bad --plot or policy is refused before the first step (nothing printed on stdout:
    no progress line, no table), not after 800 training steps."""
    policy = tmp_path / "p.toml"
    policy.write_text('[ops.paddle]\nfp32 = ["matmul_v3"]\n')
    for argv in (["demo", "--plot", str(tmp_path / "nodir" / "x.png")],
                 ["demo", "--framework", "numpy", "--policy", str(policy)]):
        with pytest.raises(SystemExit) as exc:
            raise SystemExit(main(argv, commands=DEMO))
        out, err = capsys.readouterr()
        assert exc.value.code == 2 and out == "" and err.startswith("amp-adapters: error:")


def test_misspelt_framework_op_in_a_policy_for_lists(tmp_path, capsys):
    """`lists` checks a policy's framework op names like `explain` checks its op, for both
    frameworks' sections, whichever --framework is listed."""
    path = tmp_path / "p.toml"
    path.write_text('[ops.mxnet]\nfp32 = ["FullyConected"]\n')
    assert main(["lists", "--framework", "paddle", "--policy", str(path)]) == 2
    err = capsys.readouterr().err
    assert "unknown op 'FullyConected'" in err and "'FullyConnected'" in err


@given(text=st.text(alphabet="ab=_1", max_size=8))
@settings(max_examples=60, derandomize=True, deadline=None)
def test_attr_parser_accepts_exactly_key_equals_value(text):
    key, eq, value = text.partition("=")
    if eq and key:
        assert _attr(text) == (key, value)
    else:
        with pytest.raises(argparse.ArgumentTypeError, match="KEY=VALUE"):
            _attr(text)


def test_version():
    r = run("--version")
    assert r.returncode == 0 and r.stdout.strip() == f"amp-adapters {amp_adapters.__version__}"


def test_help_is_plain_text_with_defaults(capsys):
    for argv in (["--help"], ["demo", "--help"], ["explain", "--help"]):
        with pytest.raises(SystemExit):
            main(argv, commands=DEMO)
        out = capsys.readouterr().out
        assert "``" not in out and "(default: None)" not in out
        if argv[0] == "demo":
            assert "(default: 800)" in out and "(default: both)" in out
        if argv[0] == "explain":
            assert "(default: float16)" in out


def test_lists_shows_conditional_rules(tmp_path, capsys):
    path = tmp_path / "p.toml"
    path.write_text('[ops.mxnet]\nconditional_fp32 = [{ op = "LeakyReLU", attr = "act_type", '
                    'values = ["gelu"] }]\n')
    assert main(["lists", "--framework", "mxnet", "--policy", str(path)]) == 0
    rules = capsys.readouterr().out.split("[conditional]")[1]
    assert "Activation act_type=softrelu -> fp32  (softplus)" in rules
    assert "Activation act_type=relu -> follow  (relu)" in rules
    assert "LeakyReLU act_type=gelu -> fp32" in rules  # the policy's own rule wins


def test_demo_names_a_missing_dependency_and_its_extra():
    """Without a framework or scikit-learn, one line says which extra to install (the test
    environments have them all, so the check runs on a module name that does not exist)."""
    with pytest.raises(AmpConfigError, match=r'no_such_module not installed: pip install '
                                             r'"amp-adapters\[demo\]"'):
        command.require(["no_such_module"], "demo")


def test_python_m_amp_demo_errors_are_one_line_too(capsys):
    with pytest.raises(SystemExit) as exc:
        command.main(["--steps", "-5"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err.count("\n") == 1
    assert err.startswith("python -m amp_demo: error: argument --steps")


# -- what the user's code gets: the policy and the version, named ---------------------------

@pytest.mark.parametrize("framework,drop_in", [("mxnet", "mxnet_amp.init()"),
                                               ("paddle", "paddle_amp.decorate()")])
def test_without_policy_the_answer_is_the_native_default_and_says_so(framework, drop_in,
                                                                     capsys):
    for argv in (["lists", "--framework", framework],
                 ["explain", "matmul_v2" if framework == "paddle" else "dot",
                  "--framework", framework]):
        assert main(argv) == 0
        first = capsys.readouterr().out.splitlines()[0]
        assert f"policy {framework}-native (the default of {drop_in})" in first, first
        assert f"native lists of {framework} " in first and "installed" in first, first


def test_explain_dot_under_the_native_default_and_under_o1(capsys):
    """`explain dot` once said lower (O1) while amp.init() runs dot as promote (native)."""
    assert main(["explain", "dot", "--framework", "mxnet"]) == 0
    native = capsys.readouterr().out
    assert "category: promote" in native and "native lists of mxnet 1.9.1" in native
    assert main(["explain", "dot", "--framework", "mxnet", "--policy", "O1"]) == 0
    shared = capsys.readouterr().out
    assert "category: lower" in shared and "policy O1," in shared


@pytest.mark.parametrize("framework", ["mxnet", "paddle"])
def test_lists_without_policy_are_the_native_presets_lists(framework, capsys):
    """The default lists are exactly the `<framework>-native` preset's (which the drop-ins
    use; tests/mxnet and tests/paddle compare them with init()/decorate() themselves)."""
    from amp_adapters import Policy, effective_lists
    assert main(["lists", "--framework", framework]) == 0
    out = capsys.readouterr().out
    want = effective_lists(Policy.preset(f"{framework}-native"), framework)
    for cat, ops in want.items():
        section = out.split(f"[{cat}] ")[1].split("\n[")[0]
        assert f"({len(ops)} ops)" in section
        listed = [line.split()[0] for line in section.splitlines()[1:] if line.strip()]
        assert listed == list(ops)


def test_diff_names_both_policies_and_the_version(capsys):
    assert main(["diff", "--framework", "paddle", "--version", "2.6.2"]) == 0
    assert "**paddle 2.6.2, float16**" in capsys.readouterr().out


def test_every_subcommand_has_help_text(capsys):
    parser_help = None
    for name in ("lists", "explain", "diff", "demo"):
        with pytest.raises(SystemExit) as exc:
            main([name, "--help"], commands=DEMO)
        out = capsys.readouterr().out
        assert exc.value.code == 0
        description = out.split("\n\n")[1]  # usage, then the description
        assert not description.startswith(("options:", "positional")), (name, out)
        assert len(description.split()) >= 5, (name, description)
    with pytest.raises(SystemExit):
        main(["--help"], commands=DEMO)
    parser_help = capsys.readouterr().out
    for name in ("lists", "explain", "diff", "demo"):
        line = next(l for l in parser_help.splitlines() if l.strip().startswith(name))
        assert len(line.split()) > 2, line  # a name and its help


def test_a_closed_pipe_ends_quietly_with_status_0():
    """`amp-adapters lists ... | head -1`: the reader is gone before we write."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        r = subprocess.run([EXE, "lists", "--framework", "mxnet"], stdout=write_end,
                           stderr=subprocess.PIPE, text=True, timeout=120)
    finally:
        os.close(write_end)
    assert r.returncode == 0 and r.stderr == "", r.stderr


def _diff_rows(out):
    return {line.split("|")[1].strip(" `"): (line.split("|")[3].strip(), line.split("|")[4].strip())
            for line in out.splitlines() if line.startswith("| `")}


@pytest.mark.parametrize("version", ["2.6.2", "3.3.1"])
def test_diff_covers_paddles_dygraph_lists(capsys, version):
    """``--framework paddle-dygraph``: Paddle's ops under paddle.amp's own lists (white, black,
    every other op promoting) against the shared O1, from the data (no Paddle imported)."""
    assert main(["diff", "--framework", "paddle-dygraph", "--version", version]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"**paddle-dygraph {version}, float16**")
    rows = _diff_rows(out)
    assert rows["conv3d"] == ("promote", "lower")  # in no paddle.amp list: it promotes
    assert rows["batch_norm"] == ("promote", "follow")
    assert "matmul_v2" not in rows and "softmax" not in rows  # white / black in both
    assert main(["diff", "--framework", "paddle", "--version", version]) == 0
    static = _diff_rows(capsys.readouterr().out)
    assert static["conv3d"] == ("fp32", "lower")  # the static O1 runs an unlisted op in fp32


def test_diff_refuses_a_dygraph_version_the_data_does_not_hold(capsys):
    assert main(["diff", "--framework", "paddle-dygraph", "--version", "1.0"]) == 2
    assert "known versions: 2.6.2, 3.3.1" in capsys.readouterr().err
