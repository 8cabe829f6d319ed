//! Tests that run one at a time (each takes `support::fault::serial()`): they measure
//! latency and this process's memory, read the process-wide log, or load the machine
//! with many processes. Fault injection on Redis (standalone, cluster, Sentinel), exactness
//! across instances, Redis over TLS, a bad network (a fault proxy).

mod bad_network;
mod faults;
mod faults_cluster;
mod faults_sentinel;
mod ledger;
mod ledger_tls;
mod redis_exactness;
mod redis_tls;
mod regions;
