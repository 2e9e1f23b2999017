"""``asyncfl`` command: run the app through a local SuperLink, compare runs.

``asyncfl run`` is a thin wrapper over ``flwr run`` on a simulation SuperLink of its
own (:mod:`asyncfl.deploy.simulation` starts and stops it; this module parses the
command line). Its ``-c`` arguments, TOML files and ``key=value`` pairs alike, later
ones winning, are merged and checked by :mod:`asyncfl.run_config_args` (``--resume``'s by
:mod:`asyncfl.resume_args`), and ``flwr run`` gets the one fused set (Flower itself takes a
file or pairs, not both). Outside a Flower app folder it runs the built-in app that comes
with the package (:mod:`asyncfl.deploy.builtin_app`).

``asyncfl deploy`` runs the same app as a real deployment on this machine: a
SuperLink and N SuperNode processes over Flower's transport, the engine on the
wall clock (:mod:`asyncfl.deploy.local`). ``asyncfl docker`` does the same with
a container per server and per client (:mod:`asyncfl.deploy.containers`).

A refusal is one line on stderr (exit status 2), said before anything starts or is written.
"""

from __future__ import annotations

import argparse
import math
import signal
import sys
import time
from pathlib import Path

from asyncfl.deploy.builtin_app import builtin_app_folder, is_builtin_app, is_flower_app
from asyncfl.deploy.processes import TlsFiles
from asyncfl.deploy.simulation import check_ray_address, run_app, stream_to_end
from asyncfl.errors import ConfigError
from asyncfl.resume_args import DEFAULT_SUPERNODES, RESUMABLE_KEYS, resume_run_config, write_resume_run_config
from asyncfl.run_config_args import app_overrides, check_node_count, check_run_config, flwr_run_config

#: The built-in app's keys most runs set, listed by ``asyncfl run --help``.
COMMON_KEYS = ("strategy", "concurrency", "max-arrivals", "max-time", "dataset", "model", "lr", "seed",
               "clock", "delay-model", "output-dir", "run-name")


class _Parser(argparse.ArgumentParser):
    """argparse with its refusals in one line, ``asyncfl run: error: ...`` (no usage block)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message}\n")


def _interrupt(*_) -> None:
    raise KeyboardInterrupt


def interrupted_message(app_dir: Path, fused: dict, started: float) -> str:
    """One line after Ctrl-C: what was stopped, and how to go on from the run's newest checkpoint."""
    from asyncfl.config import BUILTIN_APP_CHOICES
    from asyncfl.server_app import checkpoint

    stopped = "asyncfl: interrupted: stopped the SuperLink and its simulation"
    output = Path(str(fused.get("output-dir", BUILTIN_APP_CHOICES["output-dir"])))
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


# ---------------------------------------------------------------- the parser
def _run_epilog() -> str:
    import textwrap

    from asyncfl.decentralized.settings import GOSSIP_METHODS
    from asyncfl.strategies.registry import STRATEGY_CLASSES

    def paragraph(text: str) -> str:
        return textwrap.fill(text, width=100, subsequent_indent="  ", break_on_hyphens=False)

    return "\n".join([
        "strategies of the built-in app (-c \"strategy='NAME'\"):",
        paragraph("  server: " + ", ".join(STRATEGY_CLASSES)),
        paragraph("  decentralized (gossip): " + ", ".join(GOSSIP_METHODS)),
        paragraph("run-config keys: every key and its default is under [tool.flwr.app.config] in the app folder's "
                  "pyproject.toml (docs/methods.md describes each strategy's knobs); most runs set "
                  + ", ".join(COMMON_KEYS) + "."),
        paragraph("-c takes key=value pairs as flwr run does (strings quoted: -c \"strategy='fedasync'\") or TOML "
                  "files such as conf/mnist5k-k50-fedbuff.toml, mixed and repeated; a later one wins."),
        "examples:",
        "  asyncfl run -c \"strategy='fedasync' max-arrivals=600\"",
        "  asyncfl run --num-supernodes 200 -c conf/fedrevive-table1.toml -c \"strategy='fedbuff'\"",
        "  asyncfl run --resume outputs/RUN -c max-arrivals=600",
    ])


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return f"asyncfl {version('asyncfl')} (flwr {version('flwr')})"
    except PackageNotFoundError:
        return "asyncfl (not installed as a package)"


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="asyncfl", description="Asynchronous federated learning on Flower: run a Flower app "
                     "through a local SuperLink (simulation, processes or containers), compare runs.")
    parser.add_argument("--version", action="version", version=_version())
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="run the Flower app as a local Ray simulation (default: FedBuff on mnist5k)",
                              epilog=_run_epilog(), formatter_class=argparse.RawDescriptionHelpFormatter)
    run.add_argument("--app", type=Path, default=None,
                     help="Flower app folder (default: . where it holds a pyproject.toml, else asyncfl's built-in app)")
    run.add_argument("--num-supernodes", type=int, default=None,
                     help=f"simulated clients (default: {DEFAULT_SUPERNODES}, or the resumed run's)")
    run.add_argument("--cpus-per-client", type=float, default=1.0,
                     help="Ray CPUs per ClientApp, a whole number (Flower's client-resources-num-cpus; default: 1)")
    run.add_argument("--ray-cpus", type=int, default=None,
                     help="CPUs Ray may hand out (Flower's init-args-num-cpus; default: this machine's cores): more "
                          "than the cores starts that many ClientApp actors, e.g. for nodes that wait (device_speed); "
                          "Flower's simulation runs at most cores + 4 of them at once")
    run.add_argument("--ray-address", default=None,
                     help="attach the simulation to a running Ray cluster (HEAD:6379, as for 'ray start "
                          "--address') instead of starting Ray on this machine")
    run.add_argument("--run-config", "-c", action="append", default=[],
                     help="run-config: key=value pairs as for flwr run, or a TOML file; repeatable, mixed, a later "
                          "one wins")
    run.add_argument("--resume", type=Path, default=None, metavar="RUN_FOLDER",
                     help="go on from the newest checkpoint of a built-in app run folder, with the run-config it "
                          f"was started with; -c may change only {', '.join(RESUMABLE_KEYS)}")
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
    compose.add_argument("--out", type=Path, default=Path("docker/compose.yml"),
                         help="output file (default: docker/compose.yml); an existing file that holds another "
                              "deployment is kept unless --force")
    compose.add_argument("--force", action="store_true", help="overwrite --out even where it holds another deployment")
    _docker_parser(commands)
    compare = commands.add_parser("compare", help="table and one plot of several run folders")
    compare.add_argument("runs", nargs="+", type=Path, help="run folders (each with metrics.csv, summary.json)")
    compare.add_argument("--out", type=Path, default=Path("comparison.png"), help="plot file (default: comparison.png)")
    compare.add_argument("--target", type=float, default=None, help="common target accuracy for time-to-target")
    for sub in commands.choices.values():
        sub.set_defaults(parser=sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``asyncfl`` console script."""
    args = _parser().parse_args(argv)
    # Ctrl-C, SIGTERM (e.g. a test timeout) and SIGHUP (the terminal closed) unwind so the SuperLink and its
    # simulation are stopped; SIGINT too where a shell started this command in the background with SIGINT ignored;
    # SIGHUP not where it was ignored on purpose (`nohup asyncfl run ...` must outlive the terminal)
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGINT, _interrupt)
    if signal.getsignal(signal.SIGHUP) is not signal.SIG_IGN:
        signal.signal(signal.SIGHUP, _interrupt)
    if args.command == "run":
        return _run(args.parser, args)
    if args.command == "deploy":
        return _deploy(args.parser, args)
    if args.command == "docker":
        return _docker(args.parser, args)
    if args.command == "compose":
        return _compose(args)
    from asyncfl.simulation.compare import compare_runs

    for folder in args.runs:
        missing = [name for name in ("metrics.csv", "summary.json") if not (folder / name).is_file()]
        if missing:
            args.parser.error(f"{folder} is not a run folder (no {' or '.join(missing)}); pass folders that "
                              "asyncfl runs wrote, e.g. outputs/<run-name>")
    print(compare_runs(args.runs, args.out, args.target))
    return 0


# ---------------------------------------------------------------- asyncfl run
def _run(parser: argparse.ArgumentParser, args) -> int:
    """``asyncfl run``: every check first (one line each), then the SuperLink, Ray and ``flwr run``."""
    if args.num_supernodes is not None and args.num_supernodes < 1:
        parser.error(f"--num-supernodes must be >= 1, got {args.num_supernodes}")
    if not math.isfinite(args.cpus_per_client) or args.cpus_per_client < 1 or not args.cpus_per_client.is_integer():
        parser.error(f"--cpus-per-client must be a whole number >= 1 (Flower gives a simulated ClientApp whole CPUs), "
                     f"got {args.cpus_per_client:g}; to run more ClientApps at once than there are cores, raise "
                     "--ray-cpus")
    if args.ray_cpus is not None and args.ray_cpus < args.cpus_per_client:
        parser.error(f"--ray-cpus must be >= --cpus-per-client ({args.cpus_per_client:g}: Ray would start no "
                     f"ClientApp), got {args.ray_cpus}")
    if args.ray_cpus is not None and args.ray_address:
        parser.error("--ray-cpus is for the Ray this command starts; an attached cluster (--ray-address) has its own "
                     "CPUs: leave one of them out")
    if args.ray_address:
        try:
            check_ray_address(args.ray_address)
        except ValueError as exc:
            parser.error(str(exc))
    builtin_elsewhere = args.app is None and not is_flower_app(Path.cwd())
    args.app = _app_folder(parser, args.app)
    workdir = Path.cwd() if builtin_elsewhere else args.app  # where the ServerApp writes relative outputs
    fused, run_config, num_supernodes = (_resumed if args.resume is not None else _fresh)(parser, args)
    started = time.time()
    try:
        return run_app(args.app, run_config, num_supernodes, int(args.cpus_per_client), ray_address=args.ray_address,
                       workdir=workdir, ray_cpus=args.ray_cpus)
    except KeyboardInterrupt:
        print(interrupted_message(workdir, fused, started), file=sys.stderr)
        return 130


def _builtin_home() -> Path:
    """Where the built-in app's folder is kept outside a clone: ``$XDG_CACHE_HOME/asyncfl`` (~/.cache/asyncfl; a
    relative ``XDG_CACHE_HOME`` is ignored, as the XDG specification says)."""
    import os

    cache = os.environ.get("XDG_CACHE_HOME", "")
    return (Path(cache) if os.path.isabs(cache) else Path.home() / ".cache") / "asyncfl"


def _app_folder(parser: argparse.ArgumentParser, asked: Path | None) -> Path:
    """The Flower app folder to run: ``--app``; else ``.`` where it holds a pyproject.toml; else asyncfl's built-in
    app (installed with the package), its outputs under ``.``."""
    if asked is not None:
        if not (asked / "pyproject.toml").exists():
            parser.error(f"{asked.resolve()} has no pyproject.toml: pass a Flower app folder with --app, or leave "
                         "--app out to run asyncfl's built-in app")
        return asked
    if is_flower_app(Path.cwd()):
        return Path(".")
    try:
        return builtin_app_folder(_builtin_home())
    except (OSError, RuntimeError) as exc:  # RuntimeError: no home folder to find
        parser.error(f"cannot write the built-in app's folder: {exc}")


def _fresh(parser: argparse.ArgumentParser, args) -> tuple[dict, list[str], int]:
    """A new run: the fused run-config, checked; ``flwr run``'s ``--run-config`` arguments; the node count."""
    num_supernodes = args.num_supernodes or DEFAULT_SUPERNODES
    try:
        fused = check_run_config(args.app, args.run_config, num_supernodes)
        return fused, flwr_run_config(app_overrides(args.app, args.run_config)[1]), num_supernodes
    except ValueError as exc:
        parser.error(f"invalid run-config: {exc}")


def _resumed(parser: argparse.ArgumentParser, args) -> tuple[dict, list[str], int]:
    """A resumed run: as :func:`_fresh`, every check before ``resume/run_config.toml`` is written."""
    if not is_builtin_app(args.app):
        parser.error(f"--resume goes on with asyncfl's built-in app; {args.app.resolve()} runs another ServerApp")
    try:
        fused, num_supernodes = resume_run_config(args.resume, args.run_config, args.num_supernodes)
        check_node_count(fused, num_supernodes)
    except (OSError, ValueError) as exc:
        parser.error(f"--resume {args.resume}: {exc}")
    return fused, write_resume_run_config(args.resume, fused), num_supernodes


def deployment_run_config(app_dir: Path, run_config: list[str]) -> list[str]:
    """Overrides for a deployment: wall clock and an absolute output folder first, the user's after (they win).

    The ServerApp runs in a process started by the SuperLink, from the SuperLink's
    working directory, so a relative ``output-dir`` would land there.
    """
    if any(item.endswith(".toml") for item in run_config):
        raise ConfigError("asyncfl deploy takes key=value overrides only (Flower cannot mix a TOML file with them)")
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
        run_config = flwr_run_config(app_overrides(args.app, run_config)[1])  # old key spellings read as the new
    except ValueError as exc:
        parser.error(f"invalid run-config: {exc}")
    try:
        with LocalDeployment(args.app, args.supernodes, tls=tls, supernode_auth=args.supernode_auth) as deployment:
            auth = f"; SuperNode keys registered, in {deployment.workdir / 'keys'}" if args.supernode_auth else ""
            print(f"SuperLink on {deployment.address} (pid {deployment.superlink.pid}); "
                  f"{args.supernodes} SuperNodes; logs in {deployment.workdir}{auth}", flush=True)
            return stream_to_end(deployment.submit(run_config))
    except KeyboardInterrupt:
        print("asyncfl deploy: interrupted: stopped the SuperLink, the SuperNodes and their apps", file=sys.stderr)
        return 130


def holds_another_deployment(path: Path, num_supernodes: int, insecure: bool, cuda: bool) -> bool:
    """Whether ``path`` exists and is not the compose file these options write (a file generated with the same
    options is written again as it is: its key material next to it is kept)."""
    import yaml

    from asyncfl.deploy.compose import compose_spec

    if not path.exists():
        return False
    try:
        return yaml.safe_load(path.read_text()) != compose_spec(num_supernodes, insecure=insecure, cuda=cuda)
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return True


def _compose(args) -> int:
    """``asyncfl compose``: the file and, unless ``--insecure``, its key material; a refused setting is one line
    on stderr (exit status 2) before anything is written."""
    from asyncfl.deploy.compose import write_compose

    try:
        if args.tls:
            raise ConfigError("--tls is the default (with SuperNode and SuperExec authentication): drop it"
                              + (", and --insecure asks for none of them" if args.insecure else ""))
        if args.supernodes < 1:
            raise ConfigError(f"--supernodes must be >= 1, got {args.supernodes}")
        if not args.force and holds_another_deployment(args.out, args.supernodes, args.insecure, args.cuda):
            raise ConfigError(f"{args.out} exists and holds another deployment than this command writes: pass "
                              "--out PATH for a new file, or --force to overwrite it")
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
                       help="base image with python3: asyncfl-base:bookworm (default; 'asyncfl docker base') or "
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
    down = actions.add_parser("down", help="remove the containers, networks and volumes 'docker up' started")
    down.add_argument("--name", default=None, help="one deployment (default: every asyncfl deployment)")
    actions.add_parser("requirements", help="rewrite docker/requirements.txt from pyproject.toml")


def _docker(parser: argparse.ArgumentParser, args) -> int:
    import os

    from asyncfl.deploy import images
    from asyncfl.deploy.containers import DockerDeployment, check_security, docker_client, remove_deployment
    from asyncfl.deploy.topology import cpu_tiers

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
                raise ConfigError("asyncfl docker up takes key=value overrides only")
            check_run_config(args.app, [f"clock='wall' output-dir='{args.workdir.resolve()}'"] + run_config)
            run_config = flwr_run_config(app_overrides(args.app, run_config)[1])  # old key spellings read as the new
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
