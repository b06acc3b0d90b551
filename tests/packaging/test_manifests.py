"""The container recipe and the Kubernetes manifests (docs/deploy.md, "A
container" and "Kubernetes").  No Docker daemon and no cluster run here:
yamllint checks the YAML, and the tests read both and check what the page
says of them."""
import json
import os
import re
import shlex

import yaml

from conftest import ROOT, need, run, version

K8S = os.path.join(ROOT, "packaging", "k8s")
DOCKERFILE = os.path.join(ROOT, "packaging", "container", "Dockerfile")
YAMLLINT = ("{extends: default, rules: {line-length: {max: 250}, document-start: disable, "
            "braces: {max-spaces-inside: 1}}}")


def docs(name):
    with open(os.path.join(K8S, name)) as f:
        return [d for d in yaml.safe_load_all(f) if d]


def kind(name, k):
    found = [d for d in docs(name) if d["kind"] == k]
    assert len(found) == 1, (name, k)
    return found[0]


def flag(args, name, default=None):
    return args[args.index(name) + 1] if name in args else default


def test_manifests_pass_yamllint():
    yamllint = need("yamllint")
    r = run([yamllint, "-s", "-d", YAMLLINT, K8S])
    assert r.returncode == 0, r.stdout + r.stderr


def non_root(spec, container):
    sc = {**spec.get("securityContext", {}), **container.get("securityContext", {})}
    assert sc.get("runAsNonRoot") is True and sc.get("runAsUser", 0) != 0, container["name"]
    assert container["securityContext"].get("allowPrivilegeEscalation") is False
    assert container["securityContext"]["capabilities"]["drop"] == ["ALL"]
    if container["securityContext"].get("readOnlyRootFilesystem"):
        assert "/tmp" in [m["mountPath"] for m in container["volumeMounts"]], container["name"]
    return sc["runAsUser"]


def probes_on(container, port):
    for probe in ("readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"] == {"path": "/healthcheck", "port": port}, probe


def test_vllm_pod_shares_dev_shm_with_the_lmcached_sidecar():
    pod = kind("vllm-lmcached.yaml", "Deployment")["spec"]["template"]["spec"]
    (side,) = [c for c in pod["initContainers"] if c["name"] == "lmcached"]
    (vllm,) = [c for c in pod["containers"] if c["name"] == "vllm"]
    assert side["restartPolicy"] == "Always"          # a native sidecar
    assert side["image"] == f"lmcached:{version()}"

    # One memory-backed emptyDir at /dev/shm in both, above the L1.
    vols = {v["name"]: v for v in pod["volumes"]}
    for c in (side, vllm):
        (m,) = [m for m in c["volumeMounts"] if m["mountPath"] == "/dev/shm"]
        assert vols[m["name"]]["emptyDir"]["medium"] == "Memory"
    args = side["args"]
    limit = vols["shm"]["emptyDir"]["sizeLimit"]
    assert limit.endswith("Gi") and int(limit[:-2]) > float(flag(args, "--l1-size-gb"))

    # The probes on the HTTP port lmcached listens on.
    probes_on(side, int(flag(args, "--http-port", "8080")))

    # vLLM is pointed at the sidecar's ZMQ address, engine-driven, and
    # runs as the pool's owner (created 0600, docs/security.md).
    cfg = json.loads(flag(vllm["args"], "--kv-transfer-config"))
    assert cfg["kv_connector"] == "LMCacheMPConnector" and cfg["kv_role"] == "kv_both"
    extra = cfg["kv_connector_extra_config"]
    assert extra["lmcache.mp.host"] == "tcp://" + flag(args, "--host", "localhost")
    assert extra["lmcache.mp.port"] == int(flag(args, "--port", "5555"))
    assert extra["lmcache.mp.mp_transfer_mode"] == "engine_driven"
    assert flag(args, "--host") == "127.0.0.1"
    assert non_root(pod, side) == non_root(pod, vllm)
    assert side["securityContext"]["readOnlyRootFilesystem"] is True
    assert vllm["resources"]["limits"]["nvidia.com/gpu"] == 1


def test_coordinator_is_one_deployment_with_its_database_on_a_volume():
    dep = kind("coordinator.yaml", "Deployment")
    assert dep["spec"]["replicas"] == 1 and dep["spec"]["strategy"]["type"] == "Recreate"
    pod = dep["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert c["command"] == ["lmcached-coordinator"] and c["image"] == f"lmcached:{version()}"
    env = {e["name"]: e.get("value") for e in c["env"]}
    db = env["LMCACHE_MP_COORDINATOR_DB_PATH"]
    (mount,) = [m for m in c["volumeMounts"] if db.startswith(m["mountPath"].rstrip("/") + "/")]
    (vol,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    claim = vol["persistentVolumeClaim"]["claimName"]
    assert kind("coordinator.yaml", "PersistentVolumeClaim")["metadata"]["name"] == claim
    port = int(env["LMCACHE_MP_COORDINATOR_PORT"])
    probes_on(c, port)
    svc = kind("coordinator.yaml", "Service")
    assert svc["spec"]["ports"][0]["targetPort"] == port
    assert svc["spec"]["selector"] == dep["spec"]["selector"]["matchLabels"]
    non_root(pod, c)


def dockerfile():
    """The Dockerfile's instructions: [(INSTRUCTION, arguments)], line
    continuations joined, comments dropped."""
    with open(DOCKERFILE) as f:
        text = re.sub(r"\\\n", " ", "".join(ln for ln in f if not ln.lstrip().startswith("#")))
    return [(ln.split(None, 1)[0].upper(), ln.split(None, 1)[1].strip())
            for ln in text.splitlines() if ln.strip()]


def stages():
    out = []
    for ins, arg in dockerfile():
        if ins == "FROM":
            out.append({"from": arg, "ins": []})
        else:
            out[-1]["ins"].append((ins, arg))
    return out


def test_dockerfile_builds_the_deb_then_runs_it_on_slim_as_non_root(deb_root):
    build, final = stages()
    assert build["from"] == "debian:bookworm-slim AS build"
    assert final["from"] == "debian:bookworm-slim"
    assert any(i == "RUN" and "make deb DIST_DIR=/dist" in a for i, a in build["ins"])
    final_ins = dict(final["ins"])
    assert final_ins["COPY"].startswith("--from=build /dist/")
    assert "/tmp/dist/lmcached_*.deb" in final_ins["RUN"]
    user = final_ins["USER"].split(":")[0]
    assert user.isdigit() and int(user) != 0
    assert user in final_ins["RUN"]                 # the user the RUN creates
    assert json.loads(final_ins["ENTRYPOINT"]) == ["lmcached"]
    assert (deb_root / "usr" / "bin" / "lmcached").exists()
    cmd = json.loads(final_ins["CMD"])
    assert flag(cmd, "--host") == "0.0.0.0" and "--l1-size-gb" in cmd
    assert {"5555", "8080"} <= set(final_ins["EXPOSE"].split())
    # The build context leaves out the build trees and git.
    with open(DOCKERFILE + ".dockerignore") as f:
        ignored = set(f.read().split())
    assert {".git", "build", "build-*", "dist"} <= ignored


def test_the_image_the_manifests_use_is_the_one_the_docs_build():
    with open(os.path.join(ROOT, "docs", "deploy.md")) as f:
        page = f.read()
    build = re.search(r"^docker build (.*)$", page, re.M).group(1)
    assert flag(shlex.split(build), "-t") == f"lmcached:{version()}"
    assert flag(shlex.split(build), "-f") == "packaging/container/Dockerfile"
