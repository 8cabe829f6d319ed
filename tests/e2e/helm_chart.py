"""Renders deploy/helm/sluice with Helm's own engine and checks every object.

Run by tests/e2e/helm.rs with the virtualenv's Python (helm-python-sdk, kubernetes-validate):

    python tests/e2e/helm_chart.py CHART_DIR OUT_DIR

For each values scenario below it: validates the values against values.schema.json,
lints the chart (strict), renders it, validates every object against the Kubernetes
schemas of the oldest and newest supported versions (CRDs against the fields we use),
and writes OUT_DIR/<scenario>/ with `manifests.yaml`, `rules/<file>` (the rules
ConfigMap's data) and `container.json` (the sluice container's args and env), for the
Rust test to run `sluice check` and `sluice serve --check-config-only` on them. It also
checks that the schema refuses bad values. Exit status 0 when everything passed.
"""

import json
import os
import sys

import re

import helm_python as helm
import jsonschema
import kubernetes_validate
import yaml

REPO = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
KUBE_VERSIONS = ["1.30.0", kubernetes_validate.latest_version()]

# Scenario name -> (values, whether `sluice serve` of this build accepts the args).
SCENARIOS = {
    "defaults": ({}, True),
    "everything-memory": (
        {
            "responseHeaders": "all",
            "rules": {
                "api.yaml": {
                    "domain": "api",
                    "descriptors": [
                        {
                            "key": "api_key",
                            "rate_limit": {
                                "unit": "second",
                                "requests_per_unit": 10,
                                "algorithm": "token_bucket",
                                "burst": 20,
                            },
                        }
                    ],
                },
                "edge.yaml": open(os.path.join(REPO, "deploy/envoy/rules/edge.yaml")).read(),
            },
            "autoscaling": {"enabled": True, "minReplicas": 3, "maxReplicas": 6},
            "podDisruptionBudget": {"enabled": True, "minAvailable": 2},
            "serviceMonitor": {"enabled": True, "labels": {"release": "prometheus"}},
            "networkPolicy": {
                "enabled": True,
                "grpcFrom": [{"namespaceSelector": {}, "podSelector": {"matchLabels": {"app": "gateway"}}}],
                "httpFrom": [
                    {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
                ],
            },
            "extraArgs": ["--shadow-mode", "false"],
            "extraEnv": [{"name": "NEAR_LIMIT_RATIO", "value": "0.9"}],
            "podAnnotations": {"sidecar.istio.io/inject": "false"},
        },
        True,
    ),
    # The values deploy/istio/ tells users to install with.
    "istio": (yaml.safe_load(open(os.path.join(REPO, "deploy/istio/values.yaml"))), True),
    "existing-configmap": ({"existingConfigMap": "my-rules", "podDisruptionBudget": {"enabled": False}}, True),
    # A pod on a fraction of a core's limit, a fixed replica count, no disruption allowed,
    # a headless Service, Sentinel with the URL from a Secret.
    "scaling": (
        {
            "replicaCount": 3,
            "resources": {"requests": {"cpu": "250m"}, "limits": {"cpu": "1500m", "memory": "256Mi"}},
            "podDisruptionBudget": {"enabled": True, "maxUnavailable": 0},
            "service": {"headless": True},
            "store": "redis-sentinel",
            "redis": {"urlSecret": {"name": "redis-url", "key": "url"}},
            "topologySpreadConstraints": [
                {
                    "topologyKey": "kubernetes.io/hostname",
                    "maxSkew": 1,
                    "whenUnsatisfiable": "DoNotSchedule",
                    "labelSelector": {"matchLabels": {"app.kubernetes.io/name": "sluice"}},
                }
            ],
        },
        # No --redis-url in the args (it comes from the Secret): serve would refuse them.
        False,
    ),
    # The alerts and the dashboard: written out as rendered for tests/e2e/monitoring.rs.
    "monitoring": (
        {
            "prometheusRule": {"enabled": True, "labels": {"release": "prometheus"}},
            "grafanaDashboard": {"enabled": True, "annotations": {"grafana_folder": "Sluice"}},
        },
        True,
    ),
    "redis": (
        {
            "store": "redis",
            "redis": {
                "url": "redis://redis-master.redis.svc.cluster.local:6379/0",
                "auth": {"existingSecret": "redis-auth", "key": "password"},
            },
            # The usage ledger's PostgreSQL URL from a Secret.
            "ledger": {"urlSecret": {"name": "ledger-db", "key": "url"}, "migrate": True},
        },
        True,
    ),
    # TLS to a Redis Cluster and on the gRPC port, from cert-manager Secrets.
    "tls": (
        {
            "store": "redis-cluster",
            "redis": {
                "url": "rediss://redis-0.redis.svc:6379,rediss://redis-1.redis.svc:6379",
                "tls": {"existingSecret": "redis-client-tls"},
            },
            "grpcTls": {
                "existingSecret": "sluice-grpc-tls",
                "clientCa": "ca.crt",
                "clientSans": ["envoy.example"],
            },
        },
        True,
    ),
}

# Values the schema must accept: every Redis URL form the book documents, an umbrella
# chart's keys.
GOOD_VALUES = [
    {"redis": {"url": url}}
    for url in [
        "redis://redis:6379",
        "redis://user:pass@redis.redis.svc:6379/2",
        "rediss://redis:6380",
        "redis://10.0.0.1:7000,redis://10.0.0.2:7000,redis://10.0.0.3:7000",
        "rediss://redis-0.redis.svc:6379,rediss://redis-1.redis.svc:6379",
        "redis-0:6379,redis-1:6379",
        "redis-sentinel://sentinel:26379?sentinelServiceName=mymaster",
        "redis-sentinel://:pw@s1?sentinelServiceName=mymaster&node=s2:26380",
        "mymaster,sentinel-0:26379,sentinel-1:26379",
        "unix:///run/redis/redis.sock",
        "redis+unix:///run/redis/redis.sock",
        "/run/redis/redis.sock",
    ]
] + [
    {"global": {"imageRegistry": "example"}, "enabled": True},
    {"workers": 4},
    {"workers": ""},
]

# Values the schema must refuse.
BAD_VALUES = [
    {"store": "postgres"},
    {"responseHeaders": "some"},
    {"replicaCount": 0},
    {"unknownKey": 1},
    {"rules": {"no-extension": "domain: x"}},
    {"redis": {"url": "http://example:6379"}},
    {"redis": {"url": "redis://a:6379, http://b:6379"}},
    {"workers": 0},
    {"workers": "many"},
    {"redis": {"tls": {"secret": "typo"}}},
    {"ledger": {"url": "postgres://u:password@db/x"}},
    {"grpcTls": {"existingSecret": "s", "cert": ""}},
    {"podDisruptionBudget": {"minAvailable": 1, "maxUnavailable": 1}},
]

# The ServiceMonitor fields the chart sets (the Prometheus Operator's CRD is not among
# the Kubernetes schemas).
SERVICE_MONITOR_SCHEMA = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "spec": {
            "type": "object",
            "additionalProperties": False,
            "required": ["selector", "endpoints"],
            "properties": {
                "selector": {
                    "type": "object",
                    "properties": {"matchLabels": {"type": "object", "minProperties": 1}},
                },
                "endpoints": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "additionalProperties": False,
                        "required": ["port"],
                        "properties": {
                            "port": {"type": "string"},
                            "path": {"type": "string"},
                            "interval": {"type": "string", "pattern": "^[0-9]+(ms|s|m|h)$"},
                        },
                    },
                },
            },
        },
    },
}


# The PrometheusRule fields the chart sets (its CRD is not among the Kubernetes schemas);
# promtool checks the rules themselves.
PROMETHEUS_RULE_SCHEMA = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "spec": {
            "type": "object",
            "additionalProperties": False,
            "required": ["groups"],
            "properties": {"groups": {"type": "array", "minItems": 1}},
        },
    },
}


def fail(message):
    print(f"FAIL: {message}", file=sys.stderr)
    sys.exit(1)


def validate_object(obj, where):
    crds = {"ServiceMonitor": SERVICE_MONITOR_SCHEMA, "PrometheusRule": PROMETHEUS_RULE_SCHEMA}
    if obj["kind"] in crds:
        try:
            jsonschema.validate(obj, crds[obj["kind"]])
        except jsonschema.ValidationError as error:
            fail(f"{where}: {obj['kind']}: {error.message}")
        return
    for version in KUBE_VERSIONS:
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as error:
            fail(f"{where}: {obj['kind']} invalid for Kubernetes {version}: {error.message} at {list(error.path)}")
        except kubernetes_validate.SchemaNotFoundError as error:
            fail(f"{where}: {obj['kind']} has no Kubernetes {version} schema: {error}")


def check_scenario(chart, chart_dir, name, values, out_dir):
    chart.validate_schema(values)
    report = helm.lint(chart_dir, values, strict=True, kube_version="v1.30.0")
    problems = [m for m in report.get("messages", []) if m.get("severity", 0) >= 2]
    if problems or report.get("errors"):
        fail(f"{name}: helm lint: {problems or report['errors']}")
    rendered = chart.render(values, name="rl", namespace="sluice", is_install=True)
    objects = []
    for path, text in sorted(rendered.items()):
        if not path.endswith(".yaml"):
            continue
        for obj in yaml.safe_load_all(text):
            if obj:
                validate_object(obj, f"{name}/{path}")
                objects.append(obj)
    kinds = sorted(obj["kind"] for obj in objects)
    print(f"{name}: lint ok; {len(objects)} objects valid: {', '.join(kinds)}")

    scenario_dir = os.path.join(out_dir, name)
    rules_dir = os.path.join(scenario_dir, "rules")
    os.makedirs(rules_dir, exist_ok=True)
    with open(os.path.join(scenario_dir, "manifests.yaml"), "w") as f:
        yaml.safe_dump_all(objects, f)
    deployment = next(obj for obj in objects if obj["kind"] == "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    container = next(c for c in pod["containers"] if c["name"] == "sluice")
    rules_volume = next(v for v in pod["volumes"] if v["name"] == "rules")
    mount = next(m for m in container["volumeMounts"] if m["name"] == "rules")
    for obj in objects:
        if obj["kind"] == "ConfigMap" and obj["metadata"]["name"] == rules_volume["configMap"]["name"]:
            for file, text in obj["data"].items():
                with open(os.path.join(rules_dir, file), "w") as f:
                    f.write(text)
    write_monitoring(chart_dir, objects, scenario_dir)
    if name == "istio":
        check_istio_cluster(chart, values)
    check_scaling(name, objects, pod)
    check_rules_hook(name, objects, rules_volume["configMap"]["name"])
    with open(os.path.join(scenario_dir, "container.json"), "w") as f:
        json.dump(
            {
                "args": container["args"],
                "env": container.get("env", []),
                "rules_mount": mount["mountPath"],
                "rules_configmap": rules_volume["configMap"]["name"],
                "objects": kinds,
                "pod": pod,
                "check_args": SCENARIOS[name][1],
            },
            f,
            indent=1,
        )


def check_istio_cluster(chart, values):
    """The EnvoyFilter's cluster resolves the headless Service the chart renders for the
    install command it documents (release "sluice" in namespace "sluice"): one host per
    pod, so calls spread over every pod."""
    rendered = chart.render(values, name="sluice", namespace="sluice", is_install=True)
    headless = [
        obj["metadata"]["name"]
        for path, text in rendered.items()
        if path.endswith(".yaml")
        for obj in yaml.safe_load_all(text)
        if obj and obj["kind"] == "Service" and obj["spec"].get("clusterIP") == "None"
    ]
    filter_text = open(os.path.join(REPO, "deploy/istio/envoyfilter.yaml")).read()
    addresses = re.findall(r"address: ([a-z0-9.-]+\.svc\.cluster\.local)", filter_text)
    if len(headless) != 1 or addresses != [f"{headless[0]}.sluice.svc.cluster.local"]:
        fail(f"istio: the EnvoyFilter's cluster {addresses} is not the headless Service {headless}")
    if "type: STRICT_DNS" not in filter_text:
        fail("istio: the EnvoyFilter's cluster must be STRICT_DNS to see every pod")


def flag(args, name):
    return args[args.index(name) + 1] if name in args else None


def check_scaling(name, objects, pod):
    """What the chart promises about replicas, threads and spreading."""
    args = next(c for c in pod["containers"] if c["name"] == "sluice")["args"]
    by_kind = {}
    for obj in objects:
        by_kind.setdefault(obj["kind"], []).append(obj)
    expected = {
        # 100m requested, no CPU limit: one serving thread, not one per node core.
        "defaults": ("2", "1"),
        "everything-memory": ("6", "1"),  # autoscaling: maxReplicas
        "scaling": ("3", "2"),  # a 1500m limit: two threads
    }
    if name in expected:
        replicas, workers = expected[name]
        if (flag(args, "--replicas"), flag(args, "--workers")) != (replicas, workers):
            fail(f"{name}: --replicas {flag(args, '--replicas')} --workers {flag(args, '--workers')}, "
                 f"expected {replicas} and {workers}")
    spread = pod.get("topologySpreadConstraints", [])
    if name == "scaling":
        if [c["whenUnsatisfiable"] for c in spread] != ["DoNotSchedule"]:
            fail(f"scaling: the given topologySpreadConstraints replace the default: {spread}")
        pdb = by_kind["PodDisruptionBudget"][0]["spec"]
        if pdb.get("maxUnavailable") != 0:
            fail(f"scaling: maxUnavailable 0 rendered as {pdb}")
        headless = [s for s in by_kind["Service"] if s["spec"].get("clusterIP") == "None"]
        if len(headless) != 1:
            fail("scaling: service.headless renders one headless Service")
        env = next(c for c in pod["containers"] if c["name"] == "sluice").get("env", [])
        url = [e for e in env if e["name"] == "SLUICE_REDIS_URL"]
        if not url or url[0]["valueFrom"]["secretKeyRef"] != {"name": "redis-url", "key": "url"}:
            fail(f"scaling: SLUICE_REDIS_URL from the Secret: {env}")
        if "--redis-url" in args:
            fail("scaling: --redis-url given along with the Secret")
    else:
        keys = sorted(c["topologyKey"] for c in spread)
        if keys != ["kubernetes.io/hostname", "topology.kubernetes.io/zone"]:
            fail(f"{name}: default topologySpreadConstraints: {spread}")
        if any(c["whenUnsatisfiable"] != "ScheduleAnyway" for c in spread):
            fail(f"{name}: the default spread must never block scheduling: {spread}")
        headless_asked = SCENARIOS[name][0].get("service", {}).get("headless", False)
        if not headless_asked and any(
            s["spec"].get("clusterIP") == "None" for s in by_kind["Service"]
        ):
            fail(f"{name}: a headless Service without service.headless")


def check_rules_hook(name, objects, rules_configmap):
    """The pre-install/pre-upgrade Job checks exactly the rules the release will serve
    (the Rust test runs `sluice check` on those), from a hook ConfigMap made before it."""
    jobs = [obj for obj in objects if obj["kind"] == "Job"]
    if name == "existing-configmap":
        if jobs:
            fail("existing-configmap: no rules-check Job for a ConfigMap the chart does not own")
        return
    if len(jobs) != 1:
        fail(f"{name}: one rules-check Job expected, got {len(jobs)}")
        return
    job = jobs[0]
    hooks = {obj["metadata"]["name"]: obj for obj in objects
             if obj["kind"] == "ConfigMap" and "helm.sh/hook" in obj["metadata"].get("annotations", {})}
    annotations = job["metadata"]["annotations"]
    if annotations["helm.sh/hook"] != "pre-install,pre-upgrade":
        fail(f"{name}: the rules check runs before install and upgrade: {annotations}")
    spec = job["spec"]["template"]["spec"]
    container = spec["containers"][0]
    mount = container["volumeMounts"][0]
    if container["args"] != ["check", mount["mountPath"]] or job["spec"]["backoffLimit"] != 0:
        fail(f"{name}: the Job runs `sluice check` on its mount once: {container['args']}")
    checked = hooks.get(spec["volumes"][0]["configMap"]["name"])
    served = next(obj for obj in objects
                  if obj["kind"] == "ConfigMap" and obj["metadata"]["name"] == rules_configmap)
    if checked is None:
        fail(f"{name}: the Job's rules are not a hook ConfigMap")
        return
    if int(checked["metadata"]["annotations"]["helm.sh/hook-weight"]) >= int(annotations["helm.sh/hook-weight"]):
        fail(f"{name}: the hook ConfigMap must be made before the Job")
    if checked["data"] != served["data"]:
        fail(f"{name}: the Job checks other rules than the release serves")


def write_monitoring(chart_dir, objects, scenario_dir):
    """Writes the rendered alerts (`prometheus-rules.yaml`, the PrometheusRule's spec) and
    dashboard (`grafana-dashboard.json`) of a scenario that renders them, after checking
    that they are the chart's files unchanged."""
    for obj in objects:
        if obj["kind"] == "PrometheusRule":
            source = yaml.safe_load(open(os.path.join(chart_dir, "files/prometheus-rules.yaml")))
            if obj["spec"] != source:
                fail("the rendered PrometheusRule's spec is not files/prometheus-rules.yaml")
            with open(os.path.join(scenario_dir, "prometheus-rules.yaml"), "w") as f:
                yaml.safe_dump(obj["spec"], f)
        labels = obj["metadata"].get("labels", {})
        if obj["kind"] == "ConfigMap" and labels.get("grafana_dashboard") == "1":
            dashboard = json.loads(obj["data"]["sluice.json"])
            if dashboard != json.load(open(os.path.join(chart_dir, "files/grafana-dashboard.json"))):
                fail("the rendered dashboard ConfigMap is not files/grafana-dashboard.json")
            with open(os.path.join(scenario_dir, "grafana-dashboard.json"), "w") as f:
                json.dump(dashboard, f, indent=1)


def main():
    chart_dir, out_dir = sys.argv[1], sys.argv[2]
    chart = helm.Chart.load(chart_dir)
    for name, (values, _) in SCENARIOS.items():
        try:
            check_scenario(chart, chart_dir, name, values, out_dir)
        except helm.HelmError as error:
            fail(f"{name}: {type(error).__name__}: {error}")
    for values in BAD_VALUES:
        try:
            chart.validate_schema(values)
        except helm.HelmValuesError:
            continue
        fail(f"values.schema.json accepted bad values {values}")
    print(f"schema refused {len(BAD_VALUES)} bad value sets")
    for values in GOOD_VALUES:
        try:
            chart.validate_schema(values)
        except helm.HelmValuesError as error:
            fail(f"values.schema.json refused good values {values}: {error}")
    print(f"schema accepted {len(GOOD_VALUES)} good value sets")


if __name__ == "__main__":
    main()
