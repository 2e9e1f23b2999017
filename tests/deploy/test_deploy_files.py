"""Docker files, validated here without a Docker engine: the committed compose files are what the
generator makes, their wiring is consistent, every flag they pass exists in the installed Flower, and
what `asyncfl compose` writes is closed by default (TLS, SuperNode and SuperExec authentication, key
files 600 in a 700 folder, the SuperLink's port on loopback only) and insecure only when asked."""

import io
import re
import stat
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

ROOT = Path(__file__).resolve().parents[2]
COMMITTED = {
    "compose.yml": dict(num_supernodes=4),
    "compose-cuda.yml": dict(num_supernodes=2, cuda=True),
}
EXECUTABLE = {"superlink": "flower-superlink", "supernode": "flower-supernode", "superexec": "flower-superexec"}
HELPERS = ("install-secrets", "register-supernodes")  # one-shot containers that run no Flower executable


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
    assert services["superlink"]["ports"] == [f"127.0.0.1:{link_port}:{link_port}"]
    assert _option(services["superexec-serverapp"]["command"], "--runtime-api-address") == f"superlink:{link_port}"
    nodes = sorted(n for n in services if n.startswith("supernode-"))
    partitions, secrets = [], [_option(services["superlink"]["command"], "--superexec-auth-secret-file")]
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
        # the SuperNode and its ClientApp SuperExec hold the same secret, one per pair
        secrets.append(_option(command, "--superexec-auth-secret-file"))
        assert _option(clientapp["command"], "--superexec-auth-secret-file") == secrets[-1]
        # the SuperNode starts once its key is registered
        assert services[node]["depends_on"] == {"register-supernodes": {"condition": "service_completed_successfully"}}
    assert partitions == list(range(len(nodes)))
    assert _option(services["superexec-serverapp"]["command"], "--superexec-auth-secret-file") == secrets[0]
    assert len(set(secrets)) == len(secrets)


@pytest.mark.parametrize("name", sorted(COMMITTED))
def test_every_flag_exists_in_the_installed_flower_executables(name):
    for service_name, service in _load(name)["services"].items():
        if service_name in HELPERS:
            continue
        kind = "superexec" if service_name.startswith("superexec") else service_name.split("-")[0]
        flags = {item.split("=")[0] for item in service["command"] if item.startswith("--")}
        unknown = flags - _accepted_flags(EXECUTABLE[kind])
        assert not unknown, f"{service_name}: {EXECUTABLE[kind]} does not accept {sorted(unknown)}"


def _published_hosts(spec: dict) -> list[str]:
    """The host address of every published port (``HOST:PUBLISHED:TARGET``; no host means every interface)."""
    hosts = []
    for service in spec["services"].values():
        for port in service.get("ports", []):
            parts = str(port).split(":")
            hosts.append(parts[0] if len(parts) == 3 else "0.0.0.0")
    return hosts


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_asyncfl_compose_is_closed_by_default_and_writes_its_keys_600(tmp_path):
    # Act: `asyncfl compose` with no security option at all.
    out = tmp_path / "docker" / "compose.yml"
    done = subprocess.run([sys.executable, "-m", "asyncfl.cli", "compose", "--supernodes", "3", "--out", str(out)],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    spec = yaml.safe_load(out.read_text())
    services = spec["services"]
    link = services["superlink"]["command"]
    # Assert: nothing insecure; TLS, SuperNode and SuperExec authentication on the SuperLink ...
    assert not any("--insecure" in s["command"] for n, s in services.items() if not n.startswith("superexec-clientapp"))
    assert _option(link, "--ssl-keyfile") == "/app/secrets/server.key"
    assert "--enable-supernode-auth" in link and _option(link, "--superexec-auth-secret-file")
    for i in range(3):
        node = services[f"supernode-{i}"]["command"]
        assert _option(node, "--root-certificates") == "/app/secrets/ca.crt"
        assert _option(node, "--auth-supernode-private-key") == f"/app/secrets/supernode-{i}"
        # the ClientApp's plain HTTP stays on the deployment's network, signed with the node's secret
        clientapp = services[f"superexec-clientapp-{i}"]
        assert _option(clientapp["command"], "--superexec-auth-secret-file") and "ports" not in clientapp
    assert _option(services["superexec-serverapp"]["command"], "--root-certificates") == "/app/secrets/ca.crt"
    # ... one port published (Fleet, Control and Runtime share it in Flower 1.42), on loopback only
    assert [n for n, s in services.items() if s.get("ports")] == ["superlink"]
    assert _published_hosts(spec) == ["127.0.0.1"]
    # ... every key it needs written, mode 600 in a folder of mode 700 (public halves excepted)
    material = out.parent / "certificates"
    assert _mode(material) == 0o700
    needed = {"ca.crt", "server.pem", "server.key", "superexec-serverapp.secret"} | {
        f"{name}-{i}{suffix}" for i in range(3)
        for name, suffix in (("supernode", ""), ("supernode", ".pub"), ("superexec-clientapp", ".secret"))}
    assert {p.name for p in material.iterdir()} == needed
    for path in material.iterdir():
        assert _mode(path) & (0o022 if path.suffix == ".pub" else 0o177) == 0, path.name
    # ... and each container gets its own files only, through a volume of its own, read-only
    assert services["supernode-1"]["volumes"] == ["secrets-supernode-1:/app/secrets:ro"]
    assert services["superexec-clientapp-1"]["volumes"] == ["secrets-superexec-clientapp-1:/app/secrets:ro"]
    install = services["install-secrets"]
    assert install["volumes"][0] == "./certificates:/material:ro" and install["user"] == "root"
    script = install["command"][1]
    assert "cp superexec-clientapp-1.secret /install/superexec-clientapp-1/" in script
    assert "chown -R 49999:49999 /install/supernode-1" in script and "chmod 700 /install/supernode-1" in script
    assert "chmod 644" not in script and "777" not in script
    # Act again: a second run keeps the keys the SuperLink has registered.
    before = (material / "supernode-0").read_bytes()
    assert subprocess.call([sys.executable, "-m", "asyncfl.cli", "compose", "--supernodes", "3", "--out", str(out)],
                           stdout=subprocess.DEVNULL) == 0
    assert (material / "supernode-0").read_bytes() == before


def test_generated_certificates_verify_for_the_superlink_and_loopback(tmp_path):
    from cryptography import x509

    from asyncfl.deploy.material import ensure_material

    material = ensure_material(tmp_path / "certificates", 1)
    ca = x509.load_pem_x509_certificate((material / "ca.crt").read_bytes())
    server = x509.load_pem_x509_certificate((material / "server.pem").read_bytes())
    server.verify_directly_issued_by(ca)
    names = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert {"superlink", "localhost"} <= set(names.get_values_for_type(x509.DNSName))
    assert [str(a) for a in names.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    assert not (material / "ca.key").exists()  # nobody can sign a second certificate with this CA


def test_insecure_compose_only_when_asked_and_then_on_loopback_only(tmp_path):
    # Act: the explicit request.
    out = tmp_path / "compose-insecure.yml"
    done = subprocess.run([sys.executable, "-m", "asyncfl.cli", "compose", "--insecure", "--supernodes", "2",
                           "--out", str(out)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    text = out.read_text()
    spec = yaml.safe_load(text)
    services = spec["services"]
    # Assert: insecure as asked, and said so in the file ...
    assert "INSECURE" in text.splitlines()[2]
    assert "--insecure" in services["superlink"]["command"] and "--enable-supernode-auth" not in text
    assert all("--insecure" in s["command"] for n, s in services.items() if n != "superlink")
    assert not any(name in services for name in HELPERS) and not (tmp_path / "certificates").exists()
    # ... but reachable from this host only: no published port on 0.0.0.0 or on every interface
    assert _published_hosts(spec) == ["127.0.0.1"]
    assert [n for n, s in services.items() if s.get("ports")] == ["superlink"]


@pytest.mark.parametrize("argv, message", [
    (["--tls"], "--tls is the default"),
    (["--insecure", "--tls"], "--insecure asks for none of them"),
    (["--supernodes", "0"], "--supernodes must be >= 1"),
])
def test_compose_refuses_an_ignored_setting_in_one_line_before_writing(tmp_path, capsys, argv, message):
    from asyncfl.cli import main

    out = tmp_path / "docker" / "compose.yml"
    assert main(["compose", *argv, "--out", str(out)]) == 2
    error = capsys.readouterr().err
    assert message in error and error.count("\n") == 1
    assert not (tmp_path / "docker").exists()


def test_incomplete_key_material_is_refused_before_anything_is_written(tmp_path):
    from asyncfl.deploy.compose import write_compose
    from asyncfl.errors import ConfigError

    material = tmp_path / "certificates"
    material.mkdir()
    (material / "server.pem").write_text("a user's own certificate, without its key")
    with pytest.raises(ConfigError, match="not ca.crt, server.key"):
        write_compose(tmp_path / "compose.yml", 2)
    assert {p.name for p in material.iterdir()} == {"server.pem"} and not (tmp_path / "compose.yml").exists()
    (material / "server.pem").unlink()
    (material / "supernode-1.pub").write_text("ssh-ed25519 AAAA")
    with pytest.raises(ConfigError, match="without its other half"):
        write_compose(tmp_path / "compose.yml", 2)


def test_docker_deployment_is_closed_by_default_and_insecure_only_when_asked(tmp_path):
    from asyncfl.deploy.containers import DockerDeployment, check_security
    from asyncfl.errors import ConfigError

    # Assert (no Docker engine needed: the services are planned in the constructor)
    closed = DockerDeployment(2, workdir=tmp_path, client=object())
    link = closed.service("superlink")
    assert "--insecure" not in link.command and "--enable-supernode-auth" in link.command
    assert closed.services[0].name == "install-secrets" and closed.services[0].one_shot
    assert closed._binds(closed.service("supernode-0")) == {
        "asyncfl-secrets-supernode-0": {"bind": "/app/secrets", "mode": "ro"}}
    assert closed._binds(closed.services[0])[str(tmp_path / "certificates")]["mode"] == "ro"
    closed._write_material()
    assert _mode(closed.material) == 0o700 and _mode(closed.material / "supernode-1") == 0o600
    opened = DockerDeployment(2, workdir=tmp_path, insecure=True, client=object())
    assert "--insecure" in opened.service("superlink").command
    assert not any(s.one_shot or s.secrets for s in opened.services)
    with pytest.raises(ConfigError, match="with --insecure"):
        check_security(True, tmp_path)
    with pytest.raises(ConfigError, match="missing ca.crt, server.pem, server.key"):
        check_security(False, tmp_path / "none")


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
    assert {s.entrypoint for s in services if not s.one_shot} == {"flower-superlink", "flower-superexec",
                                                                   "flower-supernode"}
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
    assert _mode(keys.private_key) == 0o600 and _mode(tmp_path / "keys") == 0o700


def test_registration_output_is_parsed_and_a_refusal_is_an_error():
    from asyncfl.deploy.keys import ALREADY_REGISTERED, registered_node_id

    assert registered_node_id('{\n  "success": true,\n  "node-id": 10187964516090083686\n}\n') == 10187964516090083686
    assert registered_node_id('{"success": false, "error-message": "key in use"}') is None
    assert registered_node_id("Traceback (most recent call last): ...") is None
    # Flower 1.42's answer for a key registered before (a Compose deployment started again): not an error
    answer = ('{"success": false, "error-message": "Using SuperLink: s (127.0.0.1:9093)\\n\\n[code: 23] '
              'Public key already in use."}')
    assert registered_node_id(answer) is None and ALREADY_REGISTERED in answer


def test_key_registration_waits_for_the_superlink_and_accepts_a_key_it_knows(tmp_path, monkeypatch):
    from asyncfl.deploy import keys

    answers = iter([RuntimeError("connection refused"), RuntimeError(f"... {keys.ALREADY_REGISTERED}."), 7])

    def register(flwr, key, connection, env):
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    monkeypatch.setattr(keys, "register_node_key", register)
    monkeypatch.setattr(keys.time, "sleep", lambda _: None)
    said: list[str] = []
    keys.register_keys([Path("a.pub"), Path("b.pub")], "superlink:9093", tmp_path / "ca.crt", log=said.append)
    assert said == ["a.pub: registered already", "b.pub: registered as SuperNode 7"]
    monkeypatch.setattr(keys, "register_node_key", lambda *a: (_ for _ in ()).throw(RuntimeError("refused")))
    with pytest.raises(RuntimeError, match="not registered within 0 s"):
        keys.register_keys([Path("a.pub")], "superlink:9093", tmp_path / "ca.crt", wait=0.0, log=said.append)


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


@pytest.mark.parametrize("argv, message", [
    (["--supernode-auth"], "--supernode-auth is the default"),
    (["--insecure", "--tls", "."], "with --insecure"),
    (["--tls", "no-such-folder"], "missing ca.crt"),
])
def test_docker_up_refuses_an_ignored_security_setting_in_one_line_before_touching_docker(argv, message, capsys):
    from asyncfl.cli import main

    assert main(["docker", "up", *argv, "--app", str(ROOT)]) == 2
    error = capsys.readouterr().err
    assert message in error and error.count("\n") == 1
