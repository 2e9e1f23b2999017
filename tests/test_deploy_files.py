"""Docker files, validated here without a Docker engine: the committed compose files are what the
generator makes, their wiring is consistent, and every flag they pass exists in the installed Flower."""

import io
import re
import subprocess
import sys
import zipfile
from functools import lru_cache
from pathlib import Path

import flwr
import pytest
import yaml
from flwr.cli.build import build_fab_from_files

from asyncfl.deploy.compose import FLOWER_VERSION, compose_spec
from asyncfl.deploy.images import build_context, requirements_text
from asyncfl.deploy.topology import Images, cpu_tiers, deployment_services
from asyncfl.deploy.processes import flower_tool

ROOT = Path(__file__).resolve().parents[1]
COMMITTED = {
    "compose.yml": dict(num_supernodes=4),
    "compose-tls.yml": dict(num_supernodes=4, tls=True),
    "compose-cuda.yml": dict(num_supernodes=2, cuda=True),
}
EXECUTABLE = {"superlink": "flower-superlink", "supernode": "flower-supernode", "superexec": "flower-superexec"}


def _load(name: str) -> dict:
    return yaml.safe_load((ROOT / "docker" / name).read_text())


def _option(command: list[str], flag: str) -> str:
    for i, item in enumerate(command):
        if item == flag:
            return command[i + 1]
        if item.startswith(flag + "="):
            return item.split("=", 1)[1]
    raise AssertionError(f"{flag} not in {command}")


@lru_cache(maxsize=None)
def _accepted_flags(executable: str) -> frozenset[str]:
    text = subprocess.run([flower_tool(executable), "--help"], capture_output=True, text=True).stdout
    return frozenset(re.findall(r"(--[a-z][a-z0-9-]*)", text))


@pytest.mark.parametrize("name", sorted(COMMITTED))
def test_committed_compose_files_are_what_the_generator_writes(name):
    assert _load(name) == compose_spec(**COMMITTED[name]), f"regenerate docker/{name} with `asyncfl compose`"


def test_pinned_flower_version_is_the_installed_one():
    assert FLOWER_VERSION == flwr.__version__
    spec = _load("compose.yml")
    assert spec["services"]["superlink"]["image"] == f"flwr/superlink:{flwr.__version__}"
    assert all(s["image"].endswith(flwr.__version__) for n, s in spec["services"].items() if n.startswith("supernode-"))


@pytest.mark.parametrize("name", sorted(COMMITTED))
def test_services_are_wired_to_each_other(name):
    services = _load(name)["services"]
    link_port = _option(services["superlink"]["command"], "--port")
    assert services["superlink"]["ports"] == [f"{link_port}:{link_port}"]
    assert _option(services["superexec-serverapp"]["command"], "--runtime-api-address") == f"superlink:{link_port}"
    nodes = sorted(n for n in services if n.startswith("supernode-"))
    partitions = []
    for node in nodes:
        command = services[node]["command"]
        assert _option(command, "--superlink") == f"superlink:{link_port}"
        assert _option(command, "--isolation") == "process"
        config = dict(item.split("=") for item in _option(command, "--node-config").split())
        partitions.append(int(config["partition-id"]))
        assert int(config["num-partitions"]) == len(nodes)
        clientapp = services[node.replace("supernode-", "superexec-clientapp-")]
        assert _option(clientapp["command"], "--runtime-api-address") == f"{node}:{_option(command, '--port')}"
        assert clientapp["depends_on"] == [node]
    assert partitions == list(range(len(nodes)))


@pytest.mark.parametrize("name", sorted(COMMITTED))
def test_every_flag_exists_in_the_installed_flower_executables(name):
    for service_name, service in _load(name)["services"].items():
        kind = "superexec" if service_name.startswith("superexec") else service_name.split("-")[0]
        flags = {item.split("=")[0] for item in service["command"] if item.startswith("--")}
        unknown = flags - _accepted_flags(EXECUTABLE[kind])
        assert not unknown, f"{service_name}: {EXECUTABLE[kind]} does not accept {sorted(unknown)}"


def test_tls_file_mounts_certificates_and_verifies_with_the_ca():
    services = _load("compose-tls.yml")["services"]
    assert "--insecure" not in services["superlink"]["command"]
    assert "../certificates:/app/certificates:ro" in services["superlink"]["volumes"]
    assert _option(services["supernode-0"]["command"], "--root-certificates") == "/app/certificates/ca.crt"
    assert _option(services["superexec-serverapp"]["command"], "--root-certificates") == "/app/certificates/ca.crt"


def test_every_dockerfile_copy_source_is_in_the_build_context(tmp_path):
    # The context `asyncfl docker build` sends holds exactly what the Dockerfiles COPY (no .venv, no results).
    wheel = tmp_path / "wheels" / "torch-0.0-py3-none-any.whl"
    wheel.parent.mkdir()
    wheel.write_bytes(b"")
    context = build_context(ROOT, tmp_path / "context", [wheel], ca_bundle=wheel)
    for name in ("flower.Dockerfile", "superexec.Dockerfile", "superexec-cuda.Dockerfile"):
        for line in (ROOT / "docker" / name).read_text().splitlines():
            if line.startswith("COPY "):
                for source in line.split()[1:-1]:
                    assert (context / source).exists(), f"{name}: COPY {source} is not in the build context"
    assert (context / "docker" / "wheels" / wheel.name).exists()
    assert (context / "docker" / "trust" / "ca-bundle.crt").exists()
    assert not any(p.name == ".venv" or p.suffix == ".csv" for p in context.rglob("*"))


def test_docker_requirements_follow_pyproject_and_versions_are_pinned():
    text = (ROOT / "docker" / "requirements.txt").read_text()
    assert text == requirements_text(ROOT / "pyproject.toml"), "rewrite it with `asyncfl docker requirements`"
    assert not any(line.startswith(("flwr==", "flwr[", "torch")) for line in text.splitlines())
    assert f"ARG FLWR_VERSION={flwr.__version__}" in (ROOT / "docker" / "flower.Dockerfile").read_text()
    assert f"ARG FLOWER_IMAGE=asyncfl-flower:{flwr.__version__}" in (ROOT / "docker" / "superexec.Dockerfile").read_text()


def test_cpu_tiers_cycle_over_the_clientapp_containers():
    services = deployment_services(5, Images.local("f:1", "s:1"), cpus_per_client=cpu_tiers("0.25,1"),
                                   entrypoints=True)
    clientapps = [s for s in services if s.role == "clientapp"]
    assert [s.cpus for s in clientapps] == [0.25, 1.0, 0.25, 1.0, 0.25]
    assert all(s.cpus is None for s in services if s.role != "clientapp")
    assert {s.entrypoint for s in services} == {"flower-superlink", "flower-superexec", "flower-supernode"}
    assert [s.partition_id for s in services if s.role == "supernode"] == list(range(5))
    with pytest.raises(ValueError, match="> 0"):
        cpu_tiers("1,0")
    with pytest.raises(ValueError, match="comma-separated"):
        cpu_tiers("fast")


def test_compose_command_writes_a_file_for_n_supernodes(tmp_path):
    out = tmp_path / "c.yml"
    code = subprocess.call([sys.executable, "-m", "asyncfl.cli", "compose", "--supernodes", "7", "--out", str(out)],
                           stdout=subprocess.DEVNULL)
    assert code == 0
    services = yaml.safe_load(out.read_text())["services"]
    assert len([n for n in services if n.startswith("supernode-")]) == 7
    with pytest.raises(ValueError, match=">= 1"):
        compose_spec(0)


def test_deploy_command_refuses_bad_input_before_starting_anything(tmp_path, capsys):
    from asyncfl.cli import deployment_run_config, main

    with pytest.raises(SystemExit):
        main(["deploy", "--supernodes", "0"])
    assert "--supernodes must be >= 1" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["deploy", "--tls", str(tmp_path)])
    assert "make-certs.sh" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["deploy", "--supernode-auth"])
    assert "needs --tls" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["deploy", "-c", "strategy='nope'"])
    assert "choose one of" in capsys.readouterr().err
    overrides = deployment_run_config(ROOT, ["max-arrivals=5"])
    assert overrides[0].startswith("clock='wall' output-dir='/") and overrides[1] == "max-arrivals=5"
    with pytest.raises(ValueError, match="key=value overrides only"):
        deployment_run_config(ROOT, ["conf/fedadt-paper.toml"])


def test_supernode_keys_are_what_flower_loads(tmp_path):
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.hazmat.primitives.serialization import load_ssh_private_key
    from flwr.cli.supernode.register import try_load_public_key

    from asyncfl.deploy.keys import write_node_keys

    keys = write_node_keys(tmp_path / "keys", "supernode-0")
    private = load_ssh_private_key(keys.private_key.read_bytes(), None)  # what flower-supernode does
    assert isinstance(private, ec.EllipticCurvePrivateKey) and private.curve.name == "secp384r1"
    assert try_load_public_key(keys.public_key)  # what `flwr supernode register` does (exits on a bad key)
    assert keys.private_key.stat().st_mode & 0o077 == 0


def test_registration_output_is_parsed_and_a_refusal_is_an_error():
    from asyncfl.deploy.keys import registered_node_id

    assert registered_node_id('{\n  "success": true,\n  "node-id": 10187964516090083686\n}\n') == 10187964516090083686
    assert registered_node_id('{"success": false, "error-message": "key in use"}') is None
    assert registered_node_id("Traceback (most recent call last): ...") is None


def test_supernode_auth_without_tls_is_refused_before_anything_starts(tmp_path):
    from asyncfl.deploy.local import LocalDeployment

    with pytest.raises(ValueError, match="needs tls"):
        LocalDeployment(ROOT, 2, supernode_auth=True, workdir=tmp_path)
    assert not any(tmp_path.iterdir())


def test_the_fab_ships_the_package_only():
    # flwr run packages the app folder: results, tests and docs must stay out (they would grow the FAB toward
    # Flower's 10 MB cap, and a run folder removed while another run packages the app broke that run)
    files = {
        "pyproject.toml": (ROOT / "pyproject.toml").read_bytes(),
        "asyncfl/server_app/app.py": b"app = None\n",
        "asyncfl/data/partition.py": b"",
        "benchmarks/gi/runs/gi__s40__s1/config.json": b"{}",
        "benchmarks/matrix.py": b"",
        "tests/conftest.py": b"",
        "conf/gi-intertwined.toml": b"",
        "README.md": b"# asyncfl\n",
    }
    fab, _ = build_fab_from_files(files)
    shipped = {name for name in zipfile.ZipFile(io.BytesIO(fab)).namelist() if not name.startswith(".info/")}
    assert shipped == {"pyproject.toml", "asyncfl/server_app/app.py", "asyncfl/data/partition.py"}


@pytest.mark.parametrize("argv, message", [
    (["docker", "up", "--supernodes", "0"], "--supernodes must be >= 1"),
    (["docker", "up", "--cpus-per-client", "1,fast"], "comma-separated CPU counts"),
    (["docker", "up", "-c", "strategy='fedprox'"], "fedprox"),
])
def test_docker_up_refuses_bad_input_before_touching_docker(argv, message, capsys):
    from asyncfl.cli import main

    with pytest.raises(SystemExit):
        main(argv + ["--app", str(ROOT)])
    assert message in capsys.readouterr().err
