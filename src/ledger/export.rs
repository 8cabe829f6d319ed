//! `sluice usage export`: the per-key, per-window totals of the ledger, as CSV.

use std::io::Write;

use super::schema::{self, SchemaError};

/// Writes to `out` one CSV line per domain, descriptor, limit and window whose window
/// starts in [`from`, `to`) (PostgreSQL timestamps; UTC unless they name a zone), with
/// the units admitted, the batches they came in and the instances that wrote them.
/// Returns the number of lines after the header.
pub async fn csv(
    url: &str,
    from: &str,
    to: &str,
    out: &mut impl Write,
) -> Result<usize, ExportError> {
    let client = schema::connect(url).await?;
    let version = schema::version(&client).await?;
    if version != schema::VERSION {
        return Err(ExportError::Schema {
            found: version,
            wanted: schema::VERSION,
        });
    }
    client
        .batch_execute("SET TIME ZONE 'UTC'")
        .await
        .map_err(SchemaError::from)?;
    let rows = client
        .query(
            "SELECT domain, descriptor, limit_name, \
                 to_char(window_start, 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"'), window_seconds, \
                 sum(units)::bigint, count(*)::bigint, count(DISTINCT instance)::bigint \
             FROM sluice_usage \
             WHERE window_start >= $1::text::timestamptz AND window_start < $2::text::timestamptz \
             GROUP BY domain, descriptor, limit_name, window_start, window_seconds \
             ORDER BY domain, descriptor, limit_name, window_start",
            &[&from, &to],
        )
        .await
        .map_err(SchemaError::from)?;
    writeln!(
        out,
        "domain,descriptor,limit,window_start,window_seconds,units,batches,instances"
    )?;
    for row in &rows {
        let text = |at: usize| quoted(row.get::<_, &str>(at));
        writeln!(
            out,
            "{},{},{},{},{},{},{},{}",
            text(0),
            text(1),
            text(2),
            text(3),
            row.get::<_, i64>(4),
            row.get::<_, i64>(5),
            row.get::<_, i64>(6),
            row.get::<_, i64>(7),
        )?;
    }
    Ok(rows.len())
}

/// Why an export failed.
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    /// PostgreSQL refused or could not be reached.
    #[error(transparent)]
    Postgres(#[from] SchemaError),
    /// The schema is not the one this build reads.
    #[error("the ledger schema is at version {found}, this build reads version {wanted}: run `sluice ledger migrate`")]
    Schema {
        /// The version found.
        found: i32,
        /// The version this build reads.
        wanted: i32,
    },
    /// Writing the output failed.
    #[error("writing the export: {0}")]
    Io(#[from] std::io::Error),
}

/// A CSV field (RFC 4180): quoted when it holds a comma, a quote or a line break.
fn quoted(field: &str) -> String {
    if field.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", field.replace('"', "\"\""))
    } else {
        field.to_owned()
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn quotes_what_csv_needs_quoted() {
        assert_eq!(super::quoted("customer=a"), "customer=a");
        assert_eq!(super::quoted("a=1,b=2"), "\"a=1,b=2\"");
        assert_eq!(super::quoted("say \"hi\""), "\"say \"\"hi\"\"\"");
    }
}
