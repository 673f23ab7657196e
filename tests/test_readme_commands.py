"""Every command the README tells a user to run is run or checked here, so the README cannot drift
from the code.

The commands are read from the README itself: every line of its ```bash blocks (backslash
continuations joined, comments dropped, `NAME=value` assignments expanded in the lines after them)
and every inline `code span` that starts with a program a user runs (`bash setup.sh mini_paper`,
`python -m linvit.gpucheck`, ...). `CHECKS` maps each command, by pattern, to how it is checked:

- run: it runs here as written (it takes seconds);
- chain: the `linvit convert` example parses, and each folder it reads is made by a command before it
  (running it takes about 2 minutes here; tests/test_convert.py runs the conversion itself);
- dry_run: a Snakemake command runs as `snakemake -n` (nothing trains), and plans the grid its config
  asks for (`N jobs` in the README's comment beside it must be what it plans);
- slurm: the profile's dry run from the project root, as `--profile slurm` (and, for the command that
  submits, also as `--profile workflow/profiles/slurm`), planning the default grid: nothing is submitted;
- setup_sh: setup.sh has the case, and every command of that case is checked by this same table
  (what an earlier command of the case makes, say the mini paper's teacher file, as an empty file);
- help / parse: a `linvit` subcommand named in prose answers `--help`; one given with arguments parses
  with `linvit`'s own argument parser, and a config it names exists and validates;
- status: `linvit status` runs as written, on an empty project folder (`--directory`), and lists every
  job of its grid as still to run;
- tensorboard: TensorBoard is installed beside the interpreter and, given the README's `--logdir`,
  finds the events a run writes there (`tensorboard --inspect`, which reads what the server would show);
- the rest (venv, conda, variable, installed, config): the file, variable or program it relies on.

A command that no pattern covers fails `test_every_readme_command_has_a_check`: a new README command
needs a row here, and a row no command uses fails too.
"""

import re
import shlex
import subprocess
import sys
import tomllib

import pytest
import yaml

from conftest import BIN, REPO, run
from test_slurm import NO_ACCOUNTING, profile_env
from test_workflow import DEFAULT, expected_jobs, job_counts, snakemake

README = REPO / "README.md"
SETUP = REPO / "setup.sh"
# A code span in the README's prose is a command when it starts with one of these.
PROGRAMS = {"bash", "sh", "source", "linvit", "snakemake", "python", "python3", "pip", "conda", "git", "export",
            "pytest", "torchrun", "sbatch", "srun", "squeue", "sinfo", "sacctmgr", "apt-get", "sudo", "cd", "make"}
SHELL_FENCES = ("bash", "sh", "shell", "console", "zsh")

# (pattern for the whole command, check): the first pattern that matches decides.
CHECKS = [
    (r"bash setup\.sh(?: (?P<case>\w+))?", "setup_sh"),
    (r"linvit decide --help", "help"),
    (r"(?:bash setup\.sh decide|linvit decide)(?P<args>(?: .*)?)", "decide"),
    (r"sbatch --wrap \"linvit decide(?P<args>(?: .*)?)\"", "decide"),
    (r"source \.venv/bin/activate", "venv"),
    (r"conda env create -f environment\.yml", "conda"),
    (r"export LINVIT_SLURM_(?:ACCOUNT|PARTITION)=<\w+>", "variable"),
    (r"(?:linvit|snakemake)", "installed"),
    (r"snakemake --profile slurm(?: -n)?", "slurm"),
    (r"snakemake(?: .*)?", "dry_run"),
    (r"[A-Z_]+=\S+\.ya?ml", "config"),
    (r"linvit variants --size \w+", "run"),
    (r"linvit (?:shards|teacher|convert) .*", "chain"),
    (r"linvit status(?: .*)?", "status"),
    (r"tensorboard --logdir results/", "tensorboard"),
    (r"linvit [a-z-]+", "help"),
    (r"linvit [a-z-]+ .*", "parse"),
    (r"python -m linvit\.gpucheck", "module_help"),
    (r"python -m pytest(?: .*)?", "pytest"),
]


def shell_blocks(text: str) -> list[str]:
    return re.findall(rf"^```(?:{'|'.join(SHELL_FENCES)})\n(.*?)^```", text, re.S | re.M)


def block_commands(block: str) -> list[tuple[str, str]]:
    """(command, its comment) for each line of a shell block, with `NAME=value` expanded after it."""
    found, names = [], {}
    for line in re.sub(r"\\\n\s*", " ", block).splitlines():
        command, _, comment = line.partition(" #") if not line.lstrip().startswith("#") else ("", "", line)
        command = " ".join(command.split())
        if not command:
            continue
        assign = re.fullmatch(r"([A-Z_]+)=(\S+)", command)
        expanded = re.sub(r"\$\{?([A-Z_]+)\}?", lambda m: names.get(m.group(1), m.group(0)), command)
        if assign:
            names[assign.group(1)] = assign.group(2)
        found.append((expanded, comment.strip()))
    return found


def readme_commands() -> dict[str, str]:
    """{command: the comment beside it in the README ('' inline)}, in the README's order."""
    text = README.read_text()
    commands = {}
    for block in shell_blocks(text):
        for command, comment in block_commands(block):
            commands.setdefault(command, comment)
    prose = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    for span in re.findall(r"`([^`\n]+)`", prose):
        span = " ".join(span.split())
        if span.split()[0] in PROGRAMS:
            commands.setdefault(span, "")
    return commands


def setup_case(case: str) -> list[str]:
    """The commands of setup.sh's `case` branch, with its defaults filled in (`${CORES:-all}` -> all)."""
    body = re.search(rf"^\s*{re.escape(case)}\)(.*?);;", SETUP.read_text(), re.S | re.M)
    assert body, f"setup.sh has no '{case})' case"
    text = re.sub(r"\\\n\s*", " ", body.group(1))
    text = re.sub(r'"?\$\{\w+:-(\w+)\}"?', r"\1", text).replace('"$@"', "")
    text = re.sub(r"""echo (?:"[^"]*"|'[^']*'|[^;&\n]*)[^;&\n]*""", "", text)  # messages, whatever they quote
    commands = []
    for part in re.split(r"\n|;|&&", text):
        part = " ".join(part.split())
        if part and part != "shift":
            commands.append(part)
    return commands


def check_of(command: str) -> tuple[str, re.Match] | None:
    for pattern, check in CHECKS:
        match = re.fullmatch(pattern, command)
        if match:
            return check, match
    return None


COMMANDS = readme_commands()


def test_the_readme_has_commands_to_check():
    assert len(COMMANDS) >= 15, COMMANDS  # the parser still finds them (a renamed fence would lose them)
    assert "linvit variants --size micro" in COMMANDS and "bash setup.sh run" in COMMANDS
    fences = set(re.findall(r"^```(\w+)", README.read_text(), re.M))
    assert fences <= set(SHELL_FENCES) | {"yaml", "python", "text"}, fences


def test_every_readme_command_has_a_check():
    setup_commands = [c for m in (check_of(c) for c in COMMANDS) if m and m[0] == "setup_sh"
                      for c in setup_case(m[1]["case"] or "setup")]
    unchecked = [c for c in [*COMMANDS, *setup_commands] if check_of(c) is None]
    assert not unchecked, f"README (or setup.sh) commands no row of CHECKS covers: {unchecked}"
    used = {check_of(c)[0] for c in [*COMMANDS, *setup_commands]}
    assert used == {check for _, check in CHECKS}, f"rows no command uses: {set(c for _, c in CHECKS) - used}"


@pytest.mark.parametrize("command", list(COMMANDS))
def test_readme_command(command, tmp_path, capsys):
    found = check_of(command)
    if found is None:
        pytest.fail(f"no check for {command!r} (add a row to CHECKS)")
    check, match = found
    CHECKERS[check](command, match, tmp_path, capsys, COMMANDS[command])


def absolute(args: list[str]) -> list[str]:
    """Arguments naming a file of the repository, made absolute (dry runs run in a temporary folder)."""
    return [str(REPO / a) if not a.startswith("-") and "/" in a and (REPO / a).exists() else a for a in args]


VALUED = {"--cores", "-c", "--jobs", "-j", "--configfile", "--profile", "--directory", "-d", "-s", "--snakefile"}


def grid_jobs(config: dict) -> dict[str, int]:
    """expected_jobs, with teachers loaded from a file (`teachers:`) as rule teacher_pretrained."""
    from linvit.config import trained_sizes
    from linvit.grid import teacher_keys

    jobs = expected_jobs(config)
    keys, trained = teacher_keys(config), set(trained_sizes(config))
    jobs["teacher"] = sum(1 for key in keys if key.split("/")[0] in trained)  # one per teacher seed
    jobs["teacher_pretrained"] = len(keys) - jobs["teacher"]
    return {k: v for k, v in jobs.items() if v}


def made_by(command: str) -> list[str]:
    """Files a setup.sh command makes for the commands after it (relative to the run folder)."""
    args = shlex.split(command)
    if args[:2] == ["linvit", "mini-paper-inputs"]:
        config = yaml.safe_load((REPO / args[args.index("--config") + 1]).read_text())
        return [t["file"] for t in config.get("teachers", {}).values() if t.get("file")]
    return []


def check_dry_run(command, match, tmp, capsys, comment):
    args = shlex.split(command)[1:]
    if "-n" not in args:
        args = ["-n", *args]
    out = snakemake(tmp, *absolute(args))
    text = out.stdout + out.stderr
    counts = job_counts(out.stdout)
    targets = [a for i, a in enumerate(args) if not a.startswith("-") and (i == 0 or args[i - 1] not in VALUED)]
    if "--configfile" in args:
        config = yaml.safe_load((REPO / args[args.index("--configfile") + 1]).read_text())
    else:
        config = DEFAULT
    if targets:  # a named rule: it is planned
        for target in targets:
            assert counts.get(target) == 1 or f"rule {target}:" in text, (target, text[-2000:])
    else:  # the whole grid of its config
        assert {k: v for k, v in counts.items() if k != "total"} == grid_jobs(config), text[-2000:]
    stated = re.search(r"\((\d+) jobs", comment)
    if stated:
        assert counts["total"] == int(stated.group(1)), f"README says {stated.group(1)} jobs, the plan has {counts}"
    assert not (tmp / "results").exists()


def check_slurm(command, match, tmp, capsys, comment):
    env = profile_env(**NO_ACCOUNTING)
    for profile in ("slurm",) if "-n" in command.split() else ("slurm", "workflow/profiles/slurm"):
        proc = subprocess.run(["snakemake", "--profile", profile, "-n", "--directory", str(tmp)], cwd=REPO, env=env,
                              capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr[-3000:]
        text = proc.stdout + proc.stderr
        assert f"Using profile {profile}" in text
        assert {k: v for k, v in job_counts(proc.stdout).items() if k != "total"} == expected_jobs(DEFAULT)
    assert not (tmp / "results").exists()


def check_setup_sh(command, match, tmp, capsys, comment):
    subprocess.run(["bash", "-n", str(SETUP)], check=True)
    usage = re.search(r"usage: bash setup\.sh \[([\w|]+)\]", SETUP.read_text())
    case = match["case"] or "setup"
    assert usage and case in usage.group(1).split("|"), "setup.sh's usage line does not name the case"
    made = []
    for inner in setup_case(case):
        found = check_of(inner)
        assert found, f"setup.sh's {case!r} runs {inner!r}, which no row of CHECKS covers"
        (tmp / found[0]).mkdir(exist_ok=True)
        for rel in made:  # what the case's earlier commands make, as empty files: a dry run only plans
            (tmp / found[0] / rel).parent.mkdir(parents=True, exist_ok=True)
            (tmp / found[0] / rel).touch()
        CHECKERS[found[0]](inner, found[1], tmp / found[0], capsys, "")
        made += made_by(inner)


def check_venv(command, match, tmp, capsys, comment):
    text = SETUP.read_text()
    assert re.search(r"^VENV=\.venv$", text, re.M) and '-m pip install -q -e ".[test]"' in text
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert project["scripts"]["linvit"] == "linvit.cli:main"  # `linvit` on PATH once activated
    assert any(d.startswith("snakemake==") for d in project["dependencies"])  # and snakemake


def check_conda(command, match, tmp, capsys, comment):
    env = yaml.safe_load((REPO / "environment.yml").read_text())  # tests/test_packaging.py compares the pins
    assert env["name"] and any(isinstance(d, dict) and "-e ." in d.get("pip", []) for d in env["dependencies"])


def check_variable(command, match, tmp, capsys, comment):
    name = command.split()[1].split("=")[0]
    assert name in (REPO / "workflow/profiles/slurm/config.yaml").read_text(), f"the Slurm profile never reads {name}"


def check_installed(command, match, tmp, capsys, comment):
    assert (BIN / command).exists(), f"{command} is not installed beside {sys.executable}"
    run([str(BIN / command), "--version"], cwd=tmp)


def check_config(command, match, tmp, capsys, comment):
    from linvit.config import load_config, validate

    path = REPO / command.split("=", 1)[1]
    assert path.is_file(), path
    validate(load_config(path))


def check_run(command, match, tmp, capsys, comment):
    out = run(shlex.split(command), cwd=REPO)
    if command.startswith("linvit variants"):
        from linvit.registry import names

        for variant in names("variant"):
            assert re.search(rf"^\s*{variant}\b", out.stdout, re.M), (variant, out.stdout)


def check_chain(command, match, tmp, capsys, comment):
    """The README's convert example: it parses, its config validates, and every folder it reads
    (`--shards`, `--teacher`) is the `--out` of a command before it in the same block. Running the
    three took about 2 minutes on 2 cores, so tests/test_convert.py runs the conversion itself."""
    parse_linvit(command, capsys)
    block = next(b for b in shell_blocks(README.read_text()) if command in [c for c, _ in block_commands(b)])
    made = set()
    for step in [c for c, _ in block_commands(block)]:
        args = shlex.split(step)
        if step == command:
            for flag in ("--shards", "--teacher"):
                if flag in args:
                    assert args[args.index(flag) + 1] in made, f"{step!r} reads {flag} before a command makes it"
            return
        if "--out" in args:
            made.add(args[args.index("--out") + 1])


def parse_linvit(command, capsys):
    from linvit.cli import build_parser

    args = shlex.split(command)[1:]
    try:
        parsed = build_parser().parse_args(args)
    except SystemExit as stop:
        pytest.fail(f"`{command}` does not parse ({stop.code}): {capsys.readouterr().err}")
    config = getattr(parsed, "config", None)
    if config:
        from linvit.config import load_config, validate

        validate(load_config(REPO / config))
    return parsed


def check_help(command, match, tmp, capsys, comment):
    from linvit.cli import build_parser

    with pytest.raises(SystemExit) as stop:
        build_parser().parse_args([*shlex.split(command)[1:], "--help"])
    assert stop.value.code == 0 and "usage: linvit" in capsys.readouterr().out


def check_parse(command, match, tmp, capsys, comment):
    parse_linvit(command, capsys)


def check_module_help(command, match, tmp, capsys, comment):
    out = run([sys.executable, *shlex.split(command)[1:], "--help"], cwd=tmp)
    assert "usage:" in out.stdout


def check_status(command, match, tmp, capsys, comment):
    from linvit import grid
    from linvit.config import load_config

    args = shlex.split(command)
    config = load_config(REPO / (args[args.index("--configfile") + 1] if "--configfile" in args else
                                 "workflow/config/default.yaml"))
    out = run([*args, "--directory", str(tmp)], cwd=REPO)
    jobs = len(grid.jobs(config))
    assert f": {jobs} jobs, 0 finished, " in out.stdout and f"{jobs} to run" in out.stdout, out.stdout
    assert re.search(r"^rule +jobs +finished +running", out.stdout, re.M)
    assert ("\n  to run " in out.stdout) == ("--all" in args)  # every job listed, or only those to look at


def check_tensorboard(command, match, tmp, capsys, comment):
    from linvit.events import RunEvents

    args = shlex.split(command)
    logdir = tmp / args[args.index("--logdir") + 1]
    events = RunEvents(logdir / "teacher/micro/seed0/tb", batch_size=8, resumed=False)  # as a run writes them
    events.train(1, 2.5, 1e-3, 0.5)
    events.close()
    out = run([str(BIN / args[0]), "--inspect", *args[1:]], cwd=tmp)
    assert "train/loss" in out.stdout + out.stderr, out.stdout[-2000:]


def check_pytest(command, match, tmp, capsys, comment):
    out = run([sys.executable, "-m", "pytest", "--version"], cwd=REPO)
    assert "pytest" in out.stdout + out.stderr
    assert (REPO / "tests/conftest.py").is_file()


def check_decide(command, match, tmp, capsys, comment):
    """The sequential driver's arguments: its config files (the default grid and its plan when none is named)
    make a grid with a plan whose first look is the configured seeds, and the rest, Snakemake's own (a
    profile too), plan look 1 as that grid (a dry run: the driver runs Snakemake once per look)."""
    from linvit.decide import Driver
    from linvit.decide_inputs import DEFAULT_CONFIGS, grid_config, merged_config, split_args

    files, rest, _ = split_args(shlex.split(match["args"]))
    named, rest = grid_config([str(REPO / a) if a.endswith(".yaml") else a for a in rest])  # `decide CONFIG`
    files = [str(REPO / f) for f in [*named, *files] or DEFAULT_CONFIGS]
    driver = Driver(merged_config(files), files, tmp / "results", tmp / "report")
    assert driver.plan.looks[0] == len(driver.config["seeds"])
    proc = subprocess.run(["snakemake", *rest, "-n", "--directory", str(tmp), "--configfile", *files], cwd=REPO,
                          env=profile_env(**NO_ACCOUNTING), capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert {k: v for k, v in job_counts(proc.stdout).items() if k != "total"} == expected_jobs(driver.config)
    assert not (tmp / "results").exists()


CHECKERS = {"dry_run": check_dry_run, "decide": check_decide, "slurm": check_slurm, "setup_sh": check_setup_sh, "venv": check_venv,
            "conda": check_conda, "variable": check_variable, "installed": check_installed,
            "config": check_config, "run": check_run, "chain": check_chain, "help": check_help,
            "parse": check_parse, "module_help": check_module_help, "pytest": check_pytest, "status": check_status,
            "tensorboard": check_tensorboard}
assert set(CHECKERS) == {check for _, check in CHECKS}
