use prost::Message;

use super::*;
use crate::proto::rls_config::RateLimitReplace;
use crate::rules::{LoadOptions, Rules};

fn policy(unit: RateLimitUnit, requests_per_unit: u32) -> Option<RateLimitPolicy> {
    Some(RateLimitPolicy {
        unit: unit as i32,
        requests_per_unit,
        ..RateLimitPolicy::default()
    })
}

fn leaf(key: &str, value: &str, rate_limit: Option<RateLimitPolicy>) -> RateLimitDescriptor {
    RateLimitDescriptor {
        key: key.into(),
        value: value.into(),
        rate_limit,
        ..RateLimitDescriptor::default()
    }
}

fn any(config: &RateLimitConfig) -> prost_types::Any {
    prost_types::Any {
        type_url: TYPE_URL.into(),
        value: config.encode_to_vec(),
    }
}

fn compile(files: &[ConfigFile]) -> Result<Vec<String>, Vec<String>> {
    Rules::compile(files, &LoadOptions::default())
        .map(|rules| rules.dump_lines())
        .map_err(|errors| errors.iter().map(ToString::to_string).collect())
}

#[test]
fn every_field_compiles_as_the_same_file_would() {
    let mut shadowed = leaf("path", "/slow", policy(RateLimitUnit::Week, 5));
    shadowed.shadow_mode = true;
    shadowed.detailed_metric = true;
    let mut named = policy(RateLimitUnit::Minute, 10).expect("policy");
    named.name = "special".into();
    named.replaces = vec![RateLimitReplace {
        name: "general".into(),
    }];
    let mut general = policy(RateLimitUnit::Hour, 100).expect("policy");
    general.name = "general".into();
    let config = RateLimitConfig {
        name: "edge".into(),
        domain: "edge".into(),
        descriptors: vec![
            RateLimitDescriptor {
                key: "user".into(),
                rate_limit: Some(general),
                descriptors: vec![leaf("plan", "gold", Some(named)), shadowed],
                ..RateLimitDescriptor::default()
            },
            leaf(
                "internal",
                "",
                Some(RateLimitPolicy {
                    unlimited: true,
                    ..RateLimitPolicy::default()
                }),
            ),
        ],
    };
    let yaml = "domain: edge
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 100, name: general}
    descriptors:
      - key: plan
        value: gold
        rate_limit: {unit: minute, requests_per_unit: 10, name: special, replaces: [{name: general}]}
      - key: path
        value: /slow
        shadow_mode: true
        detailed_metric: true
        rate_limit: {unit: week, requests_per_unit: 5}
  - key: internal
    rate_limit: {unlimited: true}
";
    let pushed = rule_files(&[any(&config)]).expect("decoded");
    assert_eq!(pushed[0].name, "edge");
    let file = ConfigFile {
        name: "edge.yaml".into(),
        text: yaml.into(),
    };
    assert_eq!(compile(&pushed), compile(&[file]));
    assert!(compile(&pushed).is_ok());
}

#[test]
fn invalid_resources_fail_with_the_file_errors_naming_the_resource() {
    let config = RateLimitConfig {
        name: "broken".into(),
        domain: "edge".into(),
        descriptors: vec![leaf("user", "", policy(RateLimitUnit::Unknown, 5))],
    };
    let errors = compile(&rule_files(&[any(&config)]).expect("decoded")).expect_err("invalid");
    assert_eq!(errors, ["broken: invalid rate limit unit 'UNKNOWN'"]);

    let empty_domain = RateLimitConfig::default();
    let errors =
        compile(&rule_files(&[any(&empty_domain)]).expect("decoded")).expect_err("invalid");
    assert_eq!(errors, ["resource 0: config file cannot have empty domain"]);
}

#[test]
fn foreign_or_corrupt_resources_are_refused() {
    let foreign = prost_types::Any {
        type_url: "type.googleapis.com/envoy.config.cluster.v3.Cluster".into(),
        value: Vec::new(),
    };
    assert!(matches!(
        rule_files(&[foreign]),
        Err(ResourceError::WrongType { index: 0, .. })
    ));
    let corrupt = prost_types::Any {
        type_url: TYPE_URL.into(),
        value: vec![0xff, 0xff, 0xff],
    };
    assert!(matches!(
        rule_files(&[corrupt]),
        Err(ResourceError::Undecodable { index: 0, .. })
    ));
}

#[test]
fn two_resources_of_one_domain_follow_the_merge_rules_of_files() {
    let first = RateLimitConfig {
        name: "edge-users".into(),
        domain: "edge".into(),
        descriptors: vec![leaf("user", "", policy(RateLimitUnit::Hour, 5))],
    };
    let second = RateLimitConfig {
        name: "edge-keys".into(),
        domain: "edge".into(),
        descriptors: vec![leaf("api_key", "", policy(RateLimitUnit::Hour, 3))],
    };
    let files = rule_files(&[any(&first), any(&second)]).expect("decoded");
    let errors = compile(&files).expect_err("a second resource of a domain");
    assert_eq!(
        errors,
        ["edge-keys: duplicate domain 'edge' in config file"]
    );
    let merged = Rules::compile(
        &files,
        &LoadOptions {
            merge_domains: true,
            regions: None,
        },
    )
    .expect("merged");
    assert_eq!(merged.rules().count(), 2);
}
