//! The `sluice` binary: parses the command line and hands over to the library.

use std::process::ExitCode;

use anyhow::Context;
use clap::Parser;
use sluice::server::{self, Listeners};
use sluice::settings::{self, Cli, Command, ServeArgs, Settings};
use sluice::telemetry;

/// The process environment, as the settings read it.
fn env(name: &str) -> Option<String> {
    std::env::var(name).ok()
}

fn main() -> anyhow::Result<ExitCode> {
    match Cli::parse().into_command() {
        Command::Serve(args) => serve(&args),
        Command::Check(args) => {
            let options = settings::load_options(args.merge_domains, &env)?;
            let paths = match args.paths.is_empty() {
                true => vec![settings::config_path(None, &env)],
                false => args.paths,
            };
            let ok = sluice::commands::check(
                &paths,
                &options,
                &mut std::io::stdout(),
                &mut std::io::stderr(),
            )?;
            Ok(exit_code(ok))
        }
        Command::Explain(args) => {
            let options = settings::load_options(args.merge_domains, &env)?;
            let ok = sluice::commands::explain(
                &args,
                &options,
                &mut std::io::stdout(),
                &mut std::io::stderr(),
            )?;
            Ok(exit_code(ok))
        }
        Command::Ledger(settings::LedgerCommand::Migrate(args)) => {
            runtime(Some(1))?.block_on(async {
                let mut client = sluice::ledger::schema::connect(&args.ledger_url)
                    .await
                    .with_context(|| {
                        format!("connecting to {}", sluice::ledger::mask(&args.ledger_url))
                    })?;
                let applied = sluice::ledger::schema::migrate(&mut client).await?;
                match applied.as_slice() {
                    [] => println!(
                        "ledger schema already at version {}",
                        sluice::ledger::schema::VERSION
                    ),
                    applied => println!("ledger schema migrated: applied versions {applied:?}"),
                }
                Ok(ExitCode::SUCCESS)
            })
        }
        Command::Usage(settings::UsageArgs {
            command: None,
            admin,
            domain,
            descriptor,
        }) => {
            let (Some(domain), Some(descriptor)) = (domain, descriptor) else {
                anyhow::bail!(
                    "sluice usage needs --domain and --descriptor (or: sluice usage export)"
                );
            };
            let body = runtime(Some(1))?.block_on(sluice::ledger::client::usage(
                &admin,
                &domain,
                &descriptor,
            ))?;
            println!("{body}");
            Ok(ExitCode::SUCCESS)
        }
        Command::Usage(settings::UsageArgs {
            command: Some(settings::UsageCommand::Export(args)),
            ..
        }) => runtime(Some(1))?.block_on(async {
            let mut out = std::io::BufWriter::new(std::io::stdout().lock());
            sluice::ledger::export::csv(&args.ledger_url, &args.from, &args.to, &mut out)
                .await
                .with_context(|| {
                    format!("exporting from {}", sluice::ledger::mask(&args.ledger_url))
                })?;
            std::io::Write::flush(&mut out)?;
            Ok(ExitCode::SUCCESS)
        }),
        #[cfg(feature = "bench")]
        Command::Bench(args) => {
            let report = sluice::bench::run(&args)?;
            if args.json {
                println!("{}", serde_json::to_string_pretty(&report)?);
            } else {
                print!("{}", report.text());
            }
            Ok(ExitCode::SUCCESS)
        }
        #[cfg(feature = "bench")]
        Command::BenchServer(args) => runtime(args.workers)?.block_on(async {
            let listener = tokio::net::TcpListener::bind(args.grpc_addr)
                .await
                .with_context(|| format!("binding {}", args.grpc_addr))?;
            eprintln!("constant-OK RLS server on {}", args.grpc_addr);
            sluice::bench::ceiling::serve(listener, args.workers, shutdown_signal()).await?;
            Ok(ExitCode::SUCCESS)
        }),
        #[cfg(feature = "bench")]
        Command::BenchMemory(args) => {
            let report =
                sluice::bench::memory::measure(args.keys).context("reading /proc/self/status")?;
            if args.json {
                println!("{}", serde_json::to_string(&report)?);
            } else {
                println!(
                    "{} token-bucket keys ({} held): RSS {} -> {} bytes, {:.1} bytes per key",
                    report.keys,
                    report.held,
                    report.rss_before,
                    report.rss_after,
                    report.bytes_per_key
                );
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// A multi-threaded runtime with `workers` threads (default: one per core).
fn runtime(workers: Option<usize>) -> anyhow::Result<tokio::runtime::Runtime> {
    let mut runtime = tokio::runtime::Builder::new_multi_thread();
    runtime.enable_all();
    if let Some(workers) = workers {
        runtime.worker_threads(workers.max(1));
    }
    runtime.build().context("starting the async runtime")
}

fn exit_code(ok: bool) -> ExitCode {
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

fn serve(args: &ServeArgs) -> anyhow::Result<ExitCode> {
    let settings = Settings::resolve(args, &env)?;
    if args.check_config_only {
        if let sluice::settings::ConfigSource::Xds(xds) = &settings.config_source {
            println!(
                "ok: settings valid; rules come over xDS from {}",
                xds.server
            );
            return Ok(ExitCode::SUCCESS);
        }
        let ok = sluice::commands::check(
            std::slice::from_ref(&settings.config),
            &settings.load,
            &mut std::io::stdout(),
            &mut std::io::stderr(),
        )?;
        return Ok(exit_code(ok));
    }
    runtime(settings.workers)?.block_on(async {
        // Inside the runtime: the OTLP exporter's gRPC channel lives on it.
        let _telemetry = telemetry::init(
            settings.log_format,
            &settings.log_level,
            settings.tracing.as_ref(),
        );
        match sluice::listener::raise_open_file_limit() {
            Ok(limit) => tracing::debug!(limit, "open file limit"),
            Err(error) => tracing::warn!(%error, "open file limit not raised"),
        }
        let grpc = tokio::net::TcpListener::bind(settings.grpc_addr)
            .await
            .with_context(|| format!("binding gRPC listener {}", settings.grpc_addr))?;
        let http = tokio::net::TcpListener::bind(settings.http_addr)
            .await
            .with_context(|| format!("binding HTTP listener {}", settings.http_addr))?;
        // On the admin address, the admin listener serves the metrics itself.
        let prometheus = match &settings.prometheus {
            Some(prometheus) if prometheus.addr != settings.http_addr => Some(
                tokio::net::TcpListener::bind(prometheus.addr)
                    .await
                    .with_context(|| format!("binding Prometheus listener {}", prometheus.addr))?,
            ),
            _ => None,
        };
        let listeners = Listeners {
            grpc,
            http,
            prometheus,
        };
        server::run(listeners, settings, shutdown_signal()).await?;
        Ok(ExitCode::SUCCESS)
    })
}

/// Completes on SIGTERM or Ctrl-C.
async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = ctrl_c => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = ctrl_c.await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
}
