//! `sluice usage --domain D --descriptor k=v`: asks a running Sluice's admin port
//! (`GET /usage`) over plain HTTP/1.0, so the binary needs no HTTP client library.

use percent_encoding::{utf8_percent_encode, NON_ALPHANUMERIC};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Why the usage could not be read.
#[derive(Debug, thiserror::Error)]
pub enum UsageError {
    /// The admin port could not be reached or read.
    #[error("admin port {admin}: {source}")]
    Io {
        /// The address asked.
        admin: String,
        /// What failed.
        source: std::io::Error,
    },
    /// It answered with an error.
    #[error("admin port {admin}: {status}: {body}")]
    Refused {
        /// The address asked.
        admin: String,
        /// The status line.
        status: String,
        /// The answer's text.
        body: String,
    },
}

/// The JSON body of `GET /usage` for `domain` and `descriptor` from `admin`
/// (`host:port`, or an `http://` URL).
pub async fn usage(admin: &str, domain: &str, descriptor: &str) -> Result<String, UsageError> {
    let address = admin
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .to_owned();
    let io = |source| UsageError::Io {
        admin: address.clone(),
        source,
    };
    let path = format!(
        "/usage?domain={}&descriptor={}",
        utf8_percent_encode(domain, NON_ALPHANUMERIC),
        utf8_percent_encode(descriptor, NON_ALPHANUMERIC)
    );
    let mut stream = tokio::net::TcpStream::connect(&address).await.map_err(io)?;
    let request = format!("GET {path} HTTP/1.0\r\nHost: {address}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.map_err(io)?;
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).await.map_err(io)?;
    let answer = String::from_utf8_lossy(&answer);
    let (head, body) = answer.split_once("\r\n\r\n").unwrap_or((&answer, ""));
    let status = head.lines().next().unwrap_or_default().to_owned();
    if status.split_whitespace().nth(1) != Some("200") {
        return Err(UsageError::Refused {
            admin: address.clone(),
            status,
            body: body.trim().to_owned(),
        });
    }
    Ok(body.trim().to_owned())
}
