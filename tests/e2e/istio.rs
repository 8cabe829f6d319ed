//! The Istio EnvoyFilter (`deploy/istio/envoyfilter.yaml`) as Envoy sees it: the config
//! fragments it patches in (cluster, HTTP filter, virtual host actions) are applied, as
//! Istio applies them, to a listener shaped like a sidecar's inbound one, and the result
//! must pass `envoy --mode validate`. The rules of `deploy/istio/values.yaml` must pass
//! `sluice check` and serve the filter's domain.

use std::path::Path;
use std::process::Command;

use serde_json::{json, Value};
use support::e2e::envoy_bin;
use support::{repo_root, sluice_bin};

#[test]
fn istio_envoyfilter_patches_validate_with_envoy() {
    let root = repo_root();
    let text = std::fs::read_to_string(root.join("deploy/istio/envoyfilter.yaml"))
        .expect("read deploy/istio/envoyfilter.yaml");
    let docs: Vec<Value> = serde_saphyr::from_multiple(&text).expect("parse EnvoyFilter YAML");
    let patches: Vec<Value> = docs
        .iter()
        .filter(|doc| doc["kind"] == "EnvoyFilter")
        .flat_map(|doc| {
            doc["spec"]["configPatches"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .collect();
    let bootstrap = apply_patches(&patches);
    let dir = tempfile::tempdir().expect("temp dir");
    let (ok, log) = validate(&bootstrap, dir.path());
    assert!(
        ok,
        "envoy rejected the EnvoyFilter's fragments:\n{log}\n{bootstrap:#}"
    );

    // The check has teeth: a misspelled field in the inserted filter is refused.
    let mut broken = bootstrap.clone();
    broken["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
        ["http_filters"][0]["typed_config"]["failure_mode_denny"] = json!(true);
    assert!(
        !validate(&broken, dir.path()).0,
        "envoy accepted a broken filter"
    );

    // The chart values for Istio serve the filter's domain, and sluice accepts them.
    let filter = &bootstrap["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]
        ["typed_config"]["http_filters"][0]["typed_config"];
    let domain = filter["domain"].as_str().expect("domain");
    let values_text = std::fs::read_to_string(root.join("deploy/istio/values.yaml"))
        .expect("read deploy/istio/values.yaml");
    let values: Value = serde_saphyr::from_str(&values_text).expect("parse values");
    let rules = dir.path().join("rules");
    std::fs::create_dir(&rules).expect("rules dir");
    for (file, text) in values["rules"].as_object().expect("rules") {
        let text = text.as_str().expect("rule file text");
        assert!(
            text.contains(&format!("domain: {domain}\n")),
            "{file}: domain {domain}"
        );
        std::fs::write(rules.join(file), text).expect("write rule file");
    }
    let check = Command::new(sluice_bin())
        .arg("check")
        .arg(&rules)
        .output()
        .expect("run sluice check");
    assert!(
        check.status.success(),
        "sluice check deploy/istio/values.yaml rules:\n{}",
        String::from_utf8_lossy(&check.stderr)
    );
}

/// A bootstrap with a sidecar-like inbound listener, with every patch applied.
fn apply_patches(patches: &[Value]) -> Value {
    let mut clusters = vec![json!({
        "name": "inbound|8080||",
        "type": "STATIC",
        "connect_timeout": "1s",
        "load_assignment": {"cluster_name": "inbound|8080||", "endpoints": [{"lb_endpoints": [
            {"endpoint": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": 8080}}}}
        ]}]}
    })];
    let mut http_filters = vec![json!({
        "name": "envoy.filters.http.router",
        "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}
    })];
    let mut vhost = json!({
        "name": "inbound|http|8080",
        "domains": ["*"],
        "routes": [{"match": {"prefix": "/"}, "route": {"cluster": "inbound|8080||"}}]
    });
    let (mut clusters_added, mut filters_added, mut vhosts_merged) = (0, 0, 0);
    for patch in patches {
        let value = patch["patch"]["value"].clone();
        let operation = patch["patch"]["operation"].as_str().unwrap_or_default();
        assert_eq!(patch["match"]["context"], "SIDECAR_INBOUND", "{patch}");
        match patch["applyTo"].as_str().unwrap_or_default() {
            "CLUSTER" => {
                assert_eq!(operation, "ADD");
                clusters.push(value);
                clusters_added += 1;
            }
            "HTTP_FILTER" => {
                let filter = &patch["match"]["listener"]["filterChain"]["filter"];
                assert_eq!(
                    filter["name"],
                    "envoy.filters.network.http_connection_manager"
                );
                assert_eq!(filter["subFilter"]["name"], "envoy.filters.http.router");
                assert_eq!(operation, "INSERT_BEFORE");
                let router = http_filters.len() - 1;
                http_filters.insert(router, value);
                filters_added += 1;
            }
            "VIRTUAL_HOST" => {
                let name = &patch["match"]["routeConfiguration"]["vhost"]["name"];
                assert_eq!(name, &vhost["name"], "patch targets the inbound vhost");
                assert_eq!(operation, "MERGE");
                merge(&mut vhost, value);
                vhosts_merged += 1;
            }
            other => panic!("no test support for applyTo {other}"),
        }
    }
    assert_eq!((clusters_added, filters_added, vhosts_merged), (1, 1, 1));
    let rls_cluster = &http_filters[0]["typed_config"]["rate_limit_service"]["grpc_service"]
        ["envoy_grpc"]["cluster_name"];
    assert_eq!(
        rls_cluster, &clusters[1]["name"],
        "the filter calls the added cluster"
    );
    json!({
        "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": 0}}},
        "static_resources": {
            "listeners": [{
                "name": "virtualInbound",
                "address": {"socket_address": {"address": "127.0.0.1", "port_value": 15006}},
                "filter_chains": [{"filters": [{
                    "name": "envoy.filters.network.http_connection_manager",
                    "typed_config": {
                        "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
                        "stat_prefix": "inbound_0.0.0.0_8080",
                        "route_config": {"name": "inbound|8080||", "virtual_hosts": [vhost]},
                        "http_filters": http_filters
                    }
                }]}]
            }],
            "clusters": clusters
        }
    })
}

/// Istio's MERGE of a message: fields set in `patch` replace scalars, merge messages and
/// append to lists.
fn merge(target: &mut Value, patch: Value) {
    match (target, patch) {
        (Value::Object(target), Value::Object(patch)) => {
            for (key, value) in patch {
                match target.get_mut(&key) {
                    Some(existing) => merge(existing, value),
                    None => {
                        target.insert(key, value);
                    }
                }
            }
        }
        (Value::Array(target), Value::Array(patch)) => target.extend(patch),
        (target, patch) => *target = patch,
    }
}

/// Runs `envoy --mode validate` on `bootstrap`; (passed, output).
fn validate(bootstrap: &Value, dir: &Path) -> (bool, String) {
    let path = dir.join("bootstrap.json");
    std::fs::write(&path, bootstrap.to_string()).expect("write bootstrap");
    let output = Command::new(envoy_bin())
        .args(["--mode", "validate", "--use-dynamic-base-id", "-c"])
        .arg(&path)
        .output()
        .expect("run envoy --mode validate");
    let log = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status.success(), log)
}
