//! The ledger's tables, created and migrated by Sluice (`sluice ledger migrate`, or
//! `serve --ledger-migrate`). Versions are applied in order, each in the transaction
//! that records it in `sluice_ledger_schema`, under an advisory lock so that instances
//! starting together migrate once.

use tokio_postgres::Client;

use super::tls::{self, LedgerTlsError};

/// The version this build writes; the writer refuses to write to another.
pub const VERSION: i32 = 1;

/// Key of the advisory lock held while migrating (any constant: "sluice" in ASCII).
const LOCK: i64 = 0x736c_7569_6365;

/// Each version's statements, in order.
const MIGRATIONS: &[(i32, &str)] = &[(
    1,
    "CREATE TABLE sluice_usage (
        instance       text        NOT NULL,
        seq            bigint      NOT NULL,
        domain         text        NOT NULL,
        descriptor     text        NOT NULL,
        limit_name     text        NOT NULL,
        window_start   timestamptz NOT NULL,
        window_seconds bigint      NOT NULL CHECK (window_seconds > 0),
        units          bigint      NOT NULL CHECK (units > 0),
        sealed_at      timestamptz NOT NULL,
        written_at     timestamptz NOT NULL DEFAULT now(),
        PRIMARY KEY (instance, seq)
    );
    CREATE INDEX sluice_usage_by_key
        ON sluice_usage (domain, descriptor, limit_name, window_start);
    CREATE INDEX sluice_usage_by_window ON sluice_usage (window_start);",
)];

/// Why the schema could not be read or migrated.
#[derive(Debug, thiserror::Error)]
pub enum SchemaError {
    /// PostgreSQL refused or could not be reached.
    #[error("postgresql: {0}")]
    Postgres(#[from] tokio_postgres::Error),
    /// The ledger URL's TLS settings cannot be used.
    #[error("ledger TLS: {0}")]
    Tls(#[from] LedgerTlsError),
    /// The database holds a newer schema than this build knows.
    #[error("the ledger schema is at version {found}, newer than this build's {VERSION}: upgrade Sluice")]
    Newer {
        /// The version found.
        found: i32,
    },
}

/// Connects to `url`, with TLS as its `sslmode` and other libpq parameters say (see
/// [`super::tls`]; the files are read now). The connection runs on a task of its own
/// until the client is dropped.
pub async fn connect(url: &str) -> Result<Client, SchemaError> {
    let settings = tls::connection(url)?;
    let (client, connection) = tokio_postgres::connect(&settings.config, settings.tls).await?;
    tokio::spawn(async move {
        if let Err(error) = connection.await {
            tracing::debug!(%error, "ledger connection closed");
        }
    });
    Ok(client)
}

/// The schema version of the database (0: none yet).
pub(crate) async fn version(client: &Client) -> Result<i32, SchemaError> {
    let exists = client
        .query_one(
            "SELECT to_regclass('sluice_ledger_schema') IS NOT NULL",
            &[],
        )
        .await?
        .get::<_, bool>(0);
    if !exists {
        return Ok(0);
    }
    let row = client
        .query_one(
            "SELECT coalesce(max(version), 0) FROM sluice_ledger_schema",
            &[],
        )
        .await?;
    Ok(row.get(0))
}

/// Brings the schema to [`VERSION`]; returns the versions applied (none when current).
pub async fn migrate(client: &mut Client) -> Result<Vec<i32>, SchemaError> {
    let transaction = client.transaction().await?;
    transaction
        .execute("SELECT pg_advisory_xact_lock($1)", &[&LOCK])
        .await?;
    transaction
        .batch_execute(
            "CREATE TABLE IF NOT EXISTS sluice_ledger_schema (
                version    integer     PRIMARY KEY,
                applied_at timestamptz NOT NULL DEFAULT now()
            )",
        )
        .await?;
    let found: i32 = transaction
        .query_one(
            "SELECT coalesce(max(version), 0) FROM sluice_ledger_schema",
            &[],
        )
        .await?
        .get(0);
    if found > VERSION {
        return Err(SchemaError::Newer { found });
    }
    let mut applied = Vec::new();
    for (version, statements) in MIGRATIONS.iter().filter(|(v, _)| *v > found) {
        transaction.batch_execute(statements).await?;
        transaction
            .execute(
                "INSERT INTO sluice_ledger_schema (version) VALUES ($1)",
                &[version],
            )
            .await?;
        applied.push(*version);
    }
    transaction.commit().await?;
    Ok(applied)
}
