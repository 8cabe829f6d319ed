//! Generated Envoy RLS wire types (from `proto/`, compiled by `build.rs`).
//!
//! Modules nest like the protobuf packages because the generated code refers to
//! sibling packages by relative path.
#![allow(missing_docs, clippy::all, clippy::pedantic)]

pub mod envoy {
    pub mod service {
        pub mod discovery {
            pub mod v3 {
                tonic::include_proto!("envoy.service.discovery.v3");
            }
        }
        pub mod ratelimit {
            pub mod v3 {
                tonic::include_proto!("envoy.service.ratelimit.v3");
            }
        }
    }
    pub mod extensions {
        pub mod common {
            pub mod ratelimit {
                pub mod v3 {
                    tonic::include_proto!("envoy.extensions.common.ratelimit.v3");
                }
            }
        }
    }
    pub mod config {
        pub mod core {
            pub mod v3 {
                tonic::include_proto!("envoy.config.core.v3");
            }
        }
    }
    pub mod r#type {
        pub mod v3 {
            tonic::include_proto!("envoy.r#type.v3");
        }
    }
}

pub mod google {
    pub mod rpc {
        tonic::include_proto!("google.rpc");
    }
}

pub mod ratelimit {
    pub mod config {
        pub mod ratelimit {
            pub mod v3 {
                tonic::include_proto!("ratelimit.config.ratelimit.v3");
            }
        }
    }
}

/// `envoy.config.core.v3`: header values, the xDS node.
pub use envoy::config::core::v3 as core;
/// `envoy.extensions.common.ratelimit.v3`: the request descriptor.
pub use envoy::extensions::common::ratelimit::v3 as common;
/// `envoy.type.v3`: the rate limit unit of a descriptor override.
pub use envoy::r#type::v3 as types;
/// `envoy.service.discovery.v3`: the xDS state-of-the-world stream (ADS).
pub use envoy::service::discovery::v3 as discovery;
/// `envoy.service.ratelimit.v3`: the RLS request, response and service.
pub use envoy::service::ratelimit::v3 as rls;
/// `ratelimit.config.ratelimit.v3`: rules of one domain, as an xDS resource.
pub use ratelimit::config::ratelimit::v3 as rls_config;

/// Encoded file descriptor set of the protos (for gRPC reflection).
pub(crate) const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("rls_descriptor");
