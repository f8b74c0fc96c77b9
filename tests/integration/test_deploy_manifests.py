"""The Kubernetes manifests (docker/k8s) against the Kubernetes API's own models (the `kubernetes` package): every
key known and of its type, no key misspelt; and against the server they deploy: the ports, the probes on
grpc.health.v1, the drain within the grace period, the GPU and memory resources, and a config the real binary
accepts."""
import os
import re
import subprocess

import kubernetes.client as k8s
import yaml

from conftest import INFERD_BIN, SOURCE_DIR

MANIFESTS = os.path.join(SOURCE_DIR, "docker", "k8s", "inferd.yaml")
KINDS = {("v1", "ConfigMap"): "V1ConfigMap", ("apps/v1", "Deployment"): "V1Deployment", ("v1", "Service"): "V1Service",
         ("policy/v1", "PodDisruptionBudget"): "V1PodDisruptionBudget"}
PRIMITIVES = {"str": str, "int": int, "bool": bool, "float": (int, float)}


def check(value, type_name, path, errors):
    """Checks `value` against an OpenAPI type name of the kubernetes models, strictly: unknown keys are errors."""
    m = re.fullmatch(r"List\[(.+)\]", type_name)
    if m:
        if not isinstance(value, list):
            errors.append(f"{path}: a list expected")
            return
        for i, v in enumerate(value):
            check(v, m.group(1), f"{path}[{i}]", errors)
        return
    m = re.fullmatch(r"Dict\[str, (.+)\]", type_name)
    if m:
        if not isinstance(value, dict):
            errors.append(f"{path}: a mapping expected")
            return
        for key, v in value.items():
            check(v, m.group(1), f"{path}.{key}", errors)
        return
    if type_name in PRIMITIVES:
        if not isinstance(value, PRIMITIVES[type_name]) or (type_name == "int" and isinstance(value, bool)):
            errors.append(f"{path}: {type_name} expected, got {value!r}")
        return
    if type_name == "object":
        return
    model = getattr(k8s, type_name)
    if not isinstance(value, dict):
        errors.append(f"{path}: a {type_name} mapping expected")
        return
    by_json = {json_key: attr for attr, json_key in model.attribute_map.items()}
    for key, v in value.items():
        if key not in by_json:
            errors.append(f"{path}.{key}: not a field of {type_name}")
            continue
        check(v, model.openapi_types[by_json[key]], f"{path}.{key}", errors)


def documents():
    with open(MANIFESTS) as f:
        return [d for d in yaml.safe_load_all(f) if d]


def test_every_manifest_is_a_valid_kubernetes_object():
    docs = documents()
    assert {(d["apiVersion"], d["kind"]) for d in docs} == set(KINDS)
    for d in docs:
        errors = []
        check(d, KINDS[(d["apiVersion"], d["kind"])], d["kind"], errors)
        assert not errors, errors
    # The check catches what it should: a misspelt key and a wrong type.
    bad = [{**d, "spec": {**d["spec"], "replica": 2}} for d in docs if d["kind"] == "Deployment"][0]
    errors = []
    check(bad, "V1Deployment", "Deployment", errors)
    assert errors == ["Deployment.spec.replica: not a field of V1DeploymentSpec"]


def test_the_manifests_name_what_the_server_really_has(tmp_path):
    docs = {d["kind"]: d for d in documents()}
    config_text = docs["ConfigMap"]["data"]["config.yaml"]
    config = yaml.safe_load(config_text)
    pod = docs["Deployment"]["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports["grpc"] == int(config["server"]["listen"].rsplit(":", 1)[1])
    assert ports["metrics"] == int(config["server"]["metrics_listen"].rsplit(":", 1)[1])
    assert ports["http"] == int(config["server"]["http_listen"].rsplit(":", 1)[1])
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert c[probe]["grpc"]["port"] == ports["grpc"], probe
    # The drain fits the grace period after the preStop pause; a drain does not look like a dead server.
    pause = int(c["lifecycle"]["preStop"]["exec"]["command"][-1])
    drain = config["server"]["drain_timeout_s"]
    assert pod["terminationGracePeriodSeconds"] >= pause + drain + 5
    live = c["livenessProbe"]
    assert live["periodSeconds"] * live["failureThreshold"] > drain
    assert c["resources"]["limits"]["nvidia.com/gpu"] == "1"
    scrape = docs["Deployment"]["spec"]["template"]["metadata"]["annotations"]
    assert int(scrape["prometheus.io/port"]) == ports["metrics"] and scrape["prometheus.io/path"] == "/metrics"
    assert pod["securityContext"]["runAsNonRoot"] and c["securityContext"]["readOnlyRootFilesystem"]
    # The config file is mounted where the server is told to read it, the model where the config points.
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    assert c["args"] == ["--config", os.path.join(mounts["config"], "config.yaml")]
    assert config["model"]["path"].startswith(mounts["models"] + "/")
    svc = docs["Service"]["spec"]
    assert {p["targetPort"] for p in svc["ports"]} == set(ports)
    # The real binary accepts the config: it stops at the missing model (exit 1), not at the config (exit 2).
    path = tmp_path / "config.yaml"
    path.write_text(config_text)
    r = subprocess.run([INFERD_BIN, "--config", str(path)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "/models/llama-3-8b-instruct" in r.stderr, (r.returncode, r.stderr)


def defaults():
    """Every config key's default, from the real binary's reference table."""
    out = subprocess.run([INFERD_BIN, "--config-reference"], capture_output=True, text=True, check=True).stdout
    return dict(re.findall(r"^\| `([a-z_.]+)` \| ([^|]*?) \|", out, re.M))


def port(address):
    return int(address.rsplit(":", 1)[1])


def test_compose_publishes_what_the_server_listens_on(tmp_path):
    with open(os.path.join(SOURCE_DIR, "docker", "compose.yaml")) as f:
        services = yaml.safe_load(f)["services"]
    cpu, gpu = services["inferd"], services["inferd-cuda"]
    assert cpu["build"]["args"]["VARIANT"] == "cpu" and gpu["build"]["args"]["VARIANT"] == "cuda"
    # The GPU service is off unless asked for, and reserves a GPU through the NVIDIA driver.
    assert gpu["profiles"] == ["gpu"]
    (device,) = gpu["deploy"]["resources"]["reservations"]["devices"]
    assert device["driver"] == "nvidia" and device["capabilities"] == ["gpu"]
    # The GPU config is mounted where the command reads it; the model where the config points.
    mounts = {target: source for source, target, _mode in (v.rsplit(":", 2) for v in gpu["volumes"])}
    assert gpu["command"][0] == "--config"
    gpu_config_file = os.path.join(SOURCE_DIR, "docker", mounts[gpu["command"][1]])
    with open(gpu_config_file) as f:
        gpu_config = yaml.safe_load(f)
    assert any(gpu_config["model"]["path"] == m for m in mounts), (gpu_config["model"], mounts)
    # The CPU service runs the image's default config: the repository's configs/default.yaml.
    with open(os.path.join(SOURCE_DIR, "configs", "default.yaml")) as f:
        cpu_config = yaml.safe_load(f)
    d = defaults()
    for service, config in ((cpu, cpu_config), (gpu, gpu_config)):
        server = config["server"]
        listen = server.get("listen", d["server.listen"])
        metrics = server.get("metrics_listen", d["server.metrics_listen"])
        http = server["http_listen"]
        published = {int(p.split(":")[-1]) for p in service["ports"]}
        assert published == {port(listen), port(metrics), port(http)}, (service["image"], published)
        assert service["healthcheck"]["test"][-1] == f"127.0.0.1:{port(listen)}"
        assert "health-probe" in service["healthcheck"]["test"]
        drain = int(server.get("drain_timeout_s", d["server.drain_timeout_s"]))
        assert int(service["stop_grace_period"].rstrip("s")) >= drain + 5, service["image"]
        assert service["read_only"] is True
    # The real binary accepts the GPU config: it stops at the missing model (exit 1), not at the config (exit 2).
    r = subprocess.run([INFERD_BIN, "--config", gpu_config_file], capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "/models/model" in r.stderr, (r.returncode, r.stderr)


SCALE_OUT = os.path.join(SOURCE_DIR, "docker", "k8s", "scale-out.yaml")
SCALE_OUT_KINDS = {**KINDS, ("v1", "ServiceAccount"): "V1ServiceAccount",
                   ("rbac.authorization.k8s.io/v1", "Role"): "V1Role",
                   ("rbac.authorization.k8s.io/v1", "RoleBinding"): "V1RoleBinding"}
# The Inference Extension's InferencePool (a CRD: no model in the kubernetes package), its v1 fields.
INFERENCE_POOL_SPEC = {"selector": {"matchLabels"}, "targetPorts": {"number"}, "appProtocol": None,
                       "endpointPickerRef": {"group", "kind", "name", "port", "failureMode"}}


def test_the_scale_out_example_routes_to_the_replicas_it_deploys(tmp_path):
    with open(SCALE_OUT) as f:
        docs = [d for d in yaml.safe_load_all(f) if d]
    named = {(d["kind"], d["metadata"]["name"]): d for d in docs}
    for d in docs:  # every core object valid; the pool's spec only of its known fields
        if d["kind"] == "InferencePool":
            assert d["apiVersion"] == "inference.networking.k8s.io/v1"
            for key, value in d["spec"].items():
                assert key in INFERENCE_POOL_SPEC, f"InferencePool.spec.{key}"
                fields = INFERENCE_POOL_SPEC[key]
                for item in (value if isinstance(value, list) else [value] if isinstance(value, dict) else []):
                    assert set(item) <= fields, (key, item)
            continue
        errors = []
        check(d, SCALE_OUT_KINDS[(d["apiVersion"], d["kind"])], d["kind"], errors)
        assert not errors, errors
    fleet = named[("Deployment", "inferd-fleet")]["spec"]
    labels = fleet["template"]["metadata"]["labels"]
    (c,) = fleet["template"]["spec"]["containers"]
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    config_text = named[("ConfigMap", "inferd-fleet-config")]["data"]["config.yaml"]
    config = yaml.safe_load(config_text)
    assert ports["http"] == port(config["server"]["http_listen"])
    assert config["kv_events"]["enabled"] is True
    assert ports["kv-events"] == port(config["kv_events"]["endpoint"])
    assert ports["kv-replay"] == port(config["kv_events"]["replay_endpoint"])
    # The router discovers exactly these pods, on the OpenAI API's port, with the RBAC to list them.
    router = named[("Deployment", "vllm-router")]["spec"]["template"]["spec"]
    args = router["containers"][0]["args"]
    assert args[args.index("--selector") + 1] == ",".join(f"{k}={v}" for k, v in labels.items())
    assert int(args[args.index("--service-discovery-port") + 1]) == ports["http"]
    assert router["serviceAccountName"] == "vllm-router"
    binding = named[("RoleBinding", "vllm-router")]
    assert binding["roleRef"]["name"] == "vllm-router" and binding["subjects"][0]["name"] == "vllm-router"
    assert {"list", "watch"} <= set(named[("Role", "vllm-router")]["rules"][0]["verbs"])
    # The InferencePool selects the same pods on the same port, and names its endpoint picker's Service and port.
    pool = named[("InferencePool", "inferd-fleet")]["spec"]
    assert pool["selector"]["matchLabels"] == labels
    assert [p["number"] for p in pool["targetPorts"]] == [ports["http"]]
    epp_service = named[("Service", pool["endpointPickerRef"]["name"])]["spec"]
    assert pool["endpointPickerRef"]["port"]["number"] in {p["port"] for p in epp_service["ports"]}
    epp = named[("Deployment", "inferd-fleet-epp")]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert epp[epp.index("--pool-name") + 1] == "inferd-fleet"
    # The real binary accepts the fleet's config: it stops at the missing model (exit 1), not at the config (2).
    path = tmp_path / "config.yaml"
    path.write_text(config_text.replace("tcp://*:5557", "tcp://127.0.0.1:0").replace("tcp://*:5558", "tcp://127.0.0.1:0"))
    r = subprocess.run([INFERD_BIN, "--config", str(path), "--listen", "127.0.0.1:0"], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 1 and "/models/llama-3-8b-instruct" in r.stderr, (r.returncode, r.stderr)
