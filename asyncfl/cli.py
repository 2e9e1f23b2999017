"""``asyncfl`` command: run the app through a local SuperLink, compare runs.

``asyncfl run`` is a thin wrapper over ``flwr run`` on a simulation SuperLink of its
own (:mod:`asyncfl.deploy.simulation` starts and stops it; this module parses the
command line).

``asyncfl deploy`` runs the same app as a real deployment on this machine: a
SuperLink and N SuperNode processes over Flower's transport, the engine on the
wall clock (:mod:`asyncfl.deploy.local`). ``asyncfl docker`` does the same with
a container per server and per client (:mod:`asyncfl.deploy.containers`).
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from pathlib import Path

from asyncfl.deploy.processes import TlsFiles
from asyncfl.deploy.simulation import run_app, stream_to_end

def resolve_run_config(run_config: list[str]) -> list[str]:
    """Make TOML file arguments absolute (``flwr run`` is started from the app folder)."""
    return [str(Path(item).resolve()) if item.endswith(".toml") and Path(item).exists() else item for item in run_config]


BUILTIN_SERVERAPP = "asyncfl.server_app.app:app"


def is_builtin_app(app_dir: Path) -> bool:
    """Whether ``app_dir`` runs asyncfl's own ServerApp (other Flower apps bring their own run-config)."""
    import tomllib

    with open(app_dir / "pyproject.toml", "rb") as handle:
        components = tomllib.load(handle).get("tool", {}).get("flwr", {}).get("app", {}).get("components", {})
    return components.get("serverapp") == BUILTIN_SERVERAPP


def _interrupt(*_) -> None:
    raise KeyboardInterrupt


def interrupted_message(app_dir: Path, fused: dict, started: float) -> str:
    """One line after Ctrl-C: what was stopped, and how to go on from the run's newest checkpoint."""
    from asyncfl.server_app import checkpoint

    stopped = "asyncfl: interrupted: stopped the SuperLink and its simulation"
    output = Path(str(fused.get("output-dir", "outputs")))
    output = output if output.is_absolute() else app_dir.resolve() / output
    name = str(fused.get("run-name", ""))
    candidates = [output / name] if name else \
        [p for p in output.glob("*") if (p / "run_config.toml").exists() and p.stat().st_mtime >= started - 1]
    folders = sorted((p for p in candidates if p.is_dir()), key=lambda p: p.stat().st_mtime)
    if not folders:
        return f"{stopped}; no run folder was written yet"
    folder = folders[-1]
    try:
        newest = checkpoint.find(folder)
    except checkpoint.CheckpointError:
        return f"{stopped}; {folder} has the rows written so far and no checkpoint yet (checkpoint-every)"
    return (f"{stopped}; newest checkpoint {newest.name}: go on with asyncfl run --resume {folder}")


def unknown_key_message(key: str, known: dict) -> str:
    """One line for a run-config key the app does not have, with the nearest keys it does."""
    import difflib

    near = difflib.get_close_matches(key, list(known), n=3, cutoff=0.6)
    hint = f"did you mean {' or '.join(repr(k) for k in near)}?" if near else \
        "every key is listed under [tool.flwr.app.config] in the app's pyproject.toml"
    return f"unknown key {key!r}: {hint}"


def check_node_count(fused: dict, num_supernodes: int) -> None:
    """Refuse a simulation whose nodes cannot fill the built-in app's concurrency (each node runs
    ``jobs-per-client`` jobs at once): it would wait ``wait-for-nodes`` for nodes that never come, then run
    fewer jobs in flight than asked for."""
    from asyncfl.strategies.registry import STRATEGY_CLASSES

    if str(fused.get("strategy")) not in STRATEGY_CLASSES:  # the gossip methods run every peer, no concurrency
        return
    concurrency, per_node = int(fused["concurrency"]), int(fused.get("jobs-per-client", 1))
    if num_supernodes * per_node < concurrency:
        fits = num_supernodes * per_node
        raise ValueError(f"--num-supernodes {num_supernodes} cannot fill concurrency={concurrency} ({per_node} job "
                         f"per node at once): pass --num-supernodes >= {-(-concurrency // per_node)} or "
                         f"-c concurrency={fits}")


def check_run_config(app_dir: Path, run_config: list[str], num_supernodes: int | None = None) -> dict:
    """Validate the fused run-config here, before a SuperLink or Ray starts.

    Flower itself rejects unknown keys of any app; the values are checked only for
    asyncfl's built-in app, whose keys this module knows: a ``key=value`` that another
    strategy than the run's would ignore is refused too.

    Returns the fused run-config. Raises ``ValueError`` (unknown key, bad TOML) or
    :class:`asyncfl.config.ConfigError` (invalid value), naming what is valid.
    """
    from flwr.common.config import flatten_dict, get_fused_config_from_dir, get_project_config, parse_config_args

    overrides = parse_config_args(run_config) if run_config else {}
    known = flatten_dict(get_project_config(app_dir)["tool"]["flwr"]["app"]["config"])
    for key in overrides:
        if key not in known:
            raise ValueError(unknown_key_message(key, known))

    from asyncfl.config import parse_run_config, refuse_other_strategies_settings

    fused = get_fused_config_from_dir(app_dir, overrides)
    if is_builtin_app(app_dir):
        parse_run_config(fused)
        typed = [item for item in run_config if not item.endswith(".toml")]
        refuse_other_strategies_settings(parse_config_args(typed) if typed else {}, str(fused["strategy"]))
        if num_supernodes is not None:
            check_node_count(fused, num_supernodes)
    return fused


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``asyncfl`` console script."""
    parser = argparse.ArgumentParser(prog="asyncfl", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="run the Flower app as a local Ray simulation (default: FedBuff on mnist5k)")
    run.add_argument("--app", type=Path, default=Path("."), help="Flower app folder (default: .)")
    run.add_argument("--num-supernodes", type=int, default=None,
                     help="simulated clients (default: 50, or the resumed run's)")
    run.add_argument("--cpus-per-client", type=float, default=1, help="Ray CPUs per ClientApp (default: 1)")
    run.add_argument("--ray-address", default=None,
                     help="attach the simulation to a running Ray cluster (HEAD:6379, as for `ray start "
                          "--address`) instead of starting Ray on this machine")
    run.add_argument("--run-config", "-c", action="append", default=[],
                     help="run-config overrides, as for flwr run (repeatable), or a TOML file such as conf/x.toml")
    run.add_argument("--resume", type=Path, default=None, metavar="RUN_FOLDER",
                     help="go on from the newest checkpoint of a built-in app run folder, with the run-config it "
                          "was started with (-c key=value changes a stop, e.g. max-arrivals=600)")
    deploy = commands.add_parser("deploy", help="run the app on a real SuperLink + N SuperNode processes (wall clock)")
    deploy.add_argument("--app", type=Path, default=Path("."), help="Flower app folder (default: .)")
    deploy.add_argument("--supernodes", type=int, default=4, help="SuperNode processes, one partition each (default: 4)")
    deploy.add_argument("--tls", type=Path, default=None,
                        help="folder with ca.crt, server.pem, server.key (scripts/make-certs.sh) to serve over TLS")
    deploy.add_argument("--supernode-auth", action="store_true",
                        help="admit only SuperNodes whose keys were registered (a key pair each; needs --tls)")
    deploy.add_argument("--run-config", "-c", action="append", default=[],
                        help="run-config overrides as key=value (clock='wall' and an absolute output-dir are added)")
    compose = commands.add_parser("compose", help="write a Docker Compose file for N SuperNodes (TLS, SuperNode and "
                                                   "SuperExec authentication unless --insecure)")
    compose.add_argument("--supernodes", type=int, default=4, help="SuperNodes, one partition each (default: 4)")
    compose.add_argument("--insecure", action="store_true",
                         help="plain HTTP, any SuperNode admitted, no SuperExec authentication (published on "
                              "127.0.0.1 only). Default: all three on, their keys written to certificates/ next to "
                              "the file (mode 700, files 600; what is there is kept)")
    compose.add_argument("--tls", action="store_true", help=argparse.SUPPRESS)  # refused: TLS is the default
    compose.add_argument("--cuda", action="store_true", help="ClientApps from the CUDA image, one GPU each")
    compose.add_argument("--out", type=Path, default=Path("docker/compose.yml"), help="output file")
    _docker_parser(commands)
    compare = commands.add_parser("compare", help="table and one plot of several run folders")
    compare.add_argument("runs", nargs="+", type=Path, help="run folders (each with metrics.csv, summary.json)")
    compare.add_argument("--out", type=Path, default=Path("comparison.png"), help="plot file (default: comparison.png)")
    compare.add_argument("--target", type=float, default=None, help="common target accuracy for time-to-target")
    args = parser.parse_args(argv)
    # Ctrl-C, and SIGTERM (e.g. a test timeout), unwind so the SuperLink and its simulation are stopped; SIGINT
    # too where a shell started this command in the background with SIGINT ignored
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGINT, _interrupt)
    if args.command == "run":
        if args.resume is not None:
            try:
                args.run_config, resumed_nodes = resume_run_config(args.resume, args.run_config)
            except (OSError, ValueError) as exc:
                parser.error(f"--resume {args.resume}: {exc}")
            args.num_supernodes = args.num_supernodes or resumed_nodes
        args.num_supernodes = args.num_supernodes or 50
        if args.num_supernodes < 1:
            parser.error(f"--num-supernodes must be >= 1, got {args.num_supernodes}")
        if not (args.app / "pyproject.toml").exists():
            parser.error(f"{args.app.resolve()} has no pyproject.toml: pass the Flower app folder with --app")
        run_config = resolve_run_config(args.run_config)
        try:
            fused = check_run_config(args.app, run_config, args.num_supernodes)
        except ValueError as exc:
            parser.error(f"invalid run-config: {exc}")
        if args.cpus_per_client <= 0:
            parser.error(f"--cpus-per-client must be > 0, got {args.cpus_per_client}")
        started = time.time()
        try:
            return run_app(args.app, run_config, args.num_supernodes, args.cpus_per_client,
                           ray_address=args.ray_address)
        except KeyboardInterrupt:
            print(interrupted_message(args.app, fused, started), file=sys.stderr)
            return 130
    if args.command == "deploy":
        return _deploy(parser, args)
    if args.command == "docker":
        return _docker(parser, args)
    if args.command == "compose":
        return _compose(args)
    from asyncfl.simulation.compare import compare_runs

    for folder in args.runs:
        missing = [name for name in ("metrics.csv", "summary.json") if not (folder / name).is_file()]
        if missing:
            parser.error(f"compare: {folder} is not a run folder (no {' or '.join(missing)}); pass folders that "
                         "asyncfl runs wrote, e.g. outputs/<run-name>")
    print(compare_runs(args.runs, args.out, args.target))
    return 0


def resume_run_config(folder: Path, overrides: list[str]) -> tuple[list[str], int | None]:
    """The run-config to resume ``folder`` with, as one TOML file (Flower takes a file or key=value pairs, not
    both): the one the run was started with, ``overrides`` applied, ``resume-from`` and the run folder set;
    and the number of clients the run had (its summary's ``clients``), if it says."""
    import json

    from flwr.common.config import parse_config_args

    from asyncfl.server_app import checkpoint
    from asyncfl.server_app.run_folder import RUN_CONFIG_FILE, read_run_config, write_run_config

    folder = folder.expanduser().resolve()
    if not (folder / RUN_CONFIG_FILE).exists():
        raise ValueError(f"no {RUN_CONFIG_FILE} in {folder}: not a run folder of the built-in app (a library run "
                         "resumes with start(..., resume_from=...))")
    checkpoint.find(folder)  # says so now if there is none
    if any(item.endswith(".toml") for item in overrides):
        raise ValueError("with --resume, -c takes key=value changes only (the run's own run-config is the file)")
    run_config = read_run_config(folder)
    run_config.update(parse_config_args(overrides) if overrides else {})
    run_config.update({"resume-from": str(folder), "output-dir": str(folder.parent), "run-name": folder.name})
    check_resumable(folder, run_config)  # before anything starts or is written
    resume_folder = folder / "resume"
    resume_folder.mkdir(exist_ok=True)
    write_run_config(resume_folder, run_config)
    clients = None
    if (folder / "summary.json").exists():
        clients = json.loads((folder / "summary.json").read_text()).get("clients")
    return [str(resume_folder / RUN_CONFIG_FILE)], clients


def check_resumable(folder: Path, run_config: dict) -> None:
    """Refuse, here and now, a resume the ServerApp would refuse after the SuperLink and Ray started: a run-config
    that is not valid, or another strategy or other knobs than the newest readable checkpoint's. A damaged newest
    checkpoint is said and the older one that reads is the one checked (the ServerApp resumes from it too).

    Raises
    ------
    ValueError
        :class:`asyncfl.errors.CheckpointError` or :class:`asyncfl.config.ConfigError`, saying what differs by its
        run-config key.
    """
    from asyncfl.config import parse_run_config
    from asyncfl.server_app import checkpoint
    from asyncfl.strategies.strategy_state import check_saved_strategy
    from asyncfl.strategies.registry import STRATEGY_CLASSES, strategy_class

    cfg = parse_run_config(run_config)
    path, tree, skipped = checkpoint.newest_readable(folder)
    for problem in skipped:
        print(f"asyncfl: {problem}: resuming from the newest one that reads, {path.name}", file=sys.stderr)
    if cfg.strategy in STRATEGY_CLASSES:
        check_saved_strategy(tree["strategy"], strategy_class(cfg.strategy).__qualname__, cfg.strategy_config)


def deployment_run_config(app_dir: Path, run_config: list[str]) -> list[str]:
    """Overrides for a deployment: wall clock and an absolute output folder first, the user's after (they win).

    The ServerApp runs in a process started by the SuperLink, from the SuperLink's
    working directory, so a relative ``output-dir`` would land there.
    """
    if any(item.endswith(".toml") for item in run_config):
        raise ValueError("asyncfl deploy takes key=value overrides only (Flower cannot mix a TOML file with them)")
    return [f"clock='wall' output-dir='{(app_dir / 'outputs').resolve()}'"] + list(run_config)


def _deploy(parser: argparse.ArgumentParser, args) -> int:
    from asyncfl.deploy.local import LocalDeployment

    if args.supernodes < 1:
        parser.error(f"--supernodes must be >= 1, got {args.supernodes}")
    if not (args.app / "pyproject.toml").exists():
        parser.error(f"{args.app.resolve()} has no pyproject.toml: pass the Flower app folder with --app")
    tls = None
    if args.tls is not None:
        tls = TlsFiles(args.tls / "ca.crt", args.tls / "server.pem", args.tls / "server.key")
        missing = [str(p) for p in (tls.ca_cert, tls.server_cert, tls.server_key) if not p.exists()]
        if missing:
            parser.error(f"--tls {args.tls}: missing {', '.join(missing)}; create them with scripts/make-certs.sh")
    if args.supernode_auth and tls is None:
        parser.error("--supernode-auth needs --tls DIR: Flower's SuperLink authenticates SuperNodes only over TLS")
    try:
        run_config = deployment_run_config(args.app, args.run_config)
        check_run_config(args.app, run_config)
    except ValueError as exc:
        parser.error(f"invalid run-config: {exc}")
    with LocalDeployment(args.app, args.supernodes, tls=tls, supernode_auth=args.supernode_auth) as deployment:
        auth = f"; SuperNode keys registered, in {deployment.workdir / 'keys'}" if args.supernode_auth else ""
        print(f"SuperLink on {deployment.address} (pid {deployment.superlink.pid}); "
              f"{args.supernodes} SuperNodes; logs in {deployment.workdir}{auth}", flush=True)
        return stream_to_end(deployment.submit(run_config))


def _compose(args) -> int:
    """``asyncfl compose``: the file and, unless ``--insecure``, its key material; a refused setting is one line
    on stderr (exit status 2) before anything is written."""
    from asyncfl.deploy.compose import write_compose
    from asyncfl.errors import ConfigError

    try:
        if args.tls:
            raise ConfigError("--tls is the default (with SuperNode and SuperExec authentication): drop it"
                              + (", and --insecure asks for none of them" if args.insecure else ""))
        if args.supernodes < 1:
            raise ConfigError(f"--supernodes must be >= 1, got {args.supernodes}")
        print(write_compose(args.out, args.supernodes, insecure=args.insecure, cuda=args.cuda))
    except ConfigError as exc:
        print(f"asyncfl compose: {exc}", file=sys.stderr)
        return 2
    return 0


def _docker_parser(commands) -> None:
    docker = commands.add_parser("docker", help="build images and run the app in containers (one per client)")
    actions = docker.add_subparsers(dest="action", required=True)
    base = actions.add_parser("base", help="make the Debian base image with debootstrap (no registry needed)")
    base.add_argument("--tag", default=None, help="image tag (default: asyncfl-base:bookworm)")
    base.add_argument("--mirror", default=None, help="Debian archive URI (default: the host's apt source)")
    build = actions.add_parser("build", help="build the Flower and SuperExec images")
    build.add_argument("--base", default=None,
                       help="base image with python3: asyncfl-base:bookworm (default; `asyncfl docker base`) or "
                            "python:3.11-slim where a registry is reachable")
    build.add_argument("--wheels", type=Path, action="append", default=None,
                       help="folder with a torch-*.whl to install (default: the folders in PIP_FIND_LINKS)")
    build.add_argument("--torch-index-url", default="", help="index for PyTorch when no wheel is given")
    build.add_argument("--ca-bundle", type=Path, default=None,
                       help="CA bundle pip trusts inside the build (default: PIP_CERT, REQUESTS_CA_BUNDLE, "
                            "SSL_CERT_FILE or the system bundle; for TLS-inspecting proxies)")
    up = actions.add_parser("up", help="start SuperLink + N SuperNodes in containers and flwr run the app")
    up.add_argument("--app", type=Path, default=Path("."), help="Flower app folder (default: .)")
    up.add_argument("--supernodes", type=int, default=4, help="clients, one SuperNode container each (default: 4)")
    up.add_argument("--cpus-per-client", default="",
                    help="CPU limits of the ClientApp containers, cycled over clients, e.g. '0.25,0.5,1'")
    up.add_argument("--tls", type=Path, default=None,
                    help="folder with your own ca.crt, server.pem, server.key (SANs: superlink, 127.0.0.1); "
                         "default: a CA and certificate written to WORKDIR/certificates")
    up.add_argument("--insecure", action="store_true",
                    help="plain HTTP, any SuperNode admitted, no SuperExec authentication (still on 127.0.0.1 "
                         "only). Default: TLS, SuperNode and SuperExec authentication")
    up.add_argument("--supernode-auth", action="store_true", help=argparse.SUPPRESS)  # refused: the default
    up.add_argument("--name", default="asyncfl", help="deployment name (container prefix, label)")
    up.add_argument("--workdir", type=Path, default=Path(".flwr-docker"),
                    help="host folder for results (outputs/), logs and the flwr connection (default: .flwr-docker)")
    up.add_argument("--detach", action="store_true", help="start the containers and leave them running; no run")
    up.add_argument("--run-config", "-c", action="append", default=[],
                    help="run-config overrides as key=value (clock='wall' and output-dir='/app/outputs' come first)")
    down = actions.add_parser("down", help="remove the containers, networks and volumes `docker up` started")
    down.add_argument("--name", default=None, help="one deployment (default: every asyncfl deployment)")
    actions.add_parser("requirements", help="rewrite docker/requirements.txt from pyproject.toml")


def _docker(parser: argparse.ArgumentParser, args) -> int:
    import os

    from asyncfl.deploy import images
    from asyncfl.deploy.containers import DockerDeployment, check_security, docker_client, remove_deployment
    from asyncfl.deploy.topology import cpu_tiers
    from asyncfl.errors import ConfigError

    root = Path(__file__).resolve().parents[1]
    if args.action == "requirements":
        path = root / "docker" / "requirements.txt"
        path.write_text(images.requirements_text(root / "pyproject.toml"))
        print(path)
        return 0
    if args.action == "up":
        if args.supernodes < 1:
            parser.error(f"--supernodes must be >= 1, got {args.supernodes}")
        if not (args.app / "pyproject.toml").exists():
            parser.error(f"{args.app.resolve()} has no pyproject.toml: pass the Flower app folder with --app")
        try:
            if args.supernode_auth:
                raise ConfigError("--supernode-auth is the default (with TLS and SuperExec authentication): drop it")
            check_security(args.insecure, args.tls)
        except ConfigError as exc:
            print(f"asyncfl docker up: {exc}", file=sys.stderr)
            return 2
        try:
            tiers = cpu_tiers(args.cpus_per_client) if args.cpus_per_client else None
            run_config = list(args.run_config)
            if any(item.endswith(".toml") for item in run_config):
                raise ValueError("asyncfl docker up takes key=value overrides only")
            check_run_config(args.app, [f"clock='wall' output-dir='{args.workdir.resolve()}'"] + run_config)
        except ValueError as exc:
            parser.error(str(exc))
    try:
        client = docker_client()
        if args.action == "base":
            built = images.make_base_image(client, args.tag or images.BASE_IMAGE, mirror=args.mirror)
            print(f"{built.tag}: {built.size_mb} MB in {built.seconds} s")
            return 0
        if args.action == "build":
            folders = args.wheels or [Path(p) for p in os.environ.get("PIP_FIND_LINKS", "").split() if p]
            wheels = images.torch_wheels(folders)
            print(f"PyTorch: {wheels[0].name if wheels else 'from the package index'}", flush=True)
            ca_bundle = args.ca_bundle or images.ca_bundle_from_env(dict(os.environ))
            for built in images.build_images(client, root, args.base or images.BASE_IMAGE, wheels,
                                             args.torch_index_url, ca_bundle):
                print(f"{built.tag}: {built.size_mb} MB, built in {built.seconds} s")
            return 0
        if args.action == "down":
            removed = remove_deployment(client, args.name)
            print(", ".join(f"{count} {kind}" for kind, count in removed.items()) + " removed")
            return 0
        deployment = DockerDeployment(args.supernodes, args.name, args.workdir, tls_dir=args.tls,
                                      cpus_per_client=tiers, insecure=args.insecure, client=client)
        deployment.__enter__()
    except (RuntimeError, ValueError, TimeoutError) as exc:
        print(f"asyncfl docker {args.action}: {exc}", file=sys.stderr)
        return 1
    security = ("INSECURE as asked: plain HTTP, any SuperNode admitted" if args.insecure else
                f"TLS, SuperNode and SuperExec authentication, keys in {deployment.material}")
    print(f"SuperLink on {deployment.address} ({security}); {args.supernodes} SuperNode containers; results in "
          f"{deployment.outputs}; remove with `asyncfl docker down --name {args.name}`", flush=True)
    if args.detach:
        return 0
    return stream_to_end(deployment.submit(args.app, run_config))


if __name__ == "__main__":
    sys.exit(main())
