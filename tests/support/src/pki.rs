//! Test certificates made at test time with rcgen (no key is committed): a CA, and
//! leaf certificates it signs, written as PEM files into a temp directory.

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};

/// A certificate authority.
pub struct Ca {
    /// Its certificate and key, which sign leaves.
    pub issuer: CertifiedIssuer<'static, KeyPair>,
}

/// A leaf certificate and key as PEM.
pub struct Leaf {
    /// The certificate.
    pub cert_pem: String,
    /// Its private key.
    pub key_pem: String,
}

impl Ca {
    /// A new self-signed CA whose common name is `name`.
    pub fn new(name: &str) -> Self {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("ca params");
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let key = KeyPair::generate().expect("ca key");
        Self {
            issuer: CertifiedIssuer::self_signed(params, key).expect("self-signed ca"),
        }
    }

    /// The CA certificate as PEM.
    pub fn pem(&self) -> String {
        self.issuer.as_ref().pem()
    }

    /// A server certificate for `sans` (DNS names or IPs).
    pub fn server(&self, sans: &[&str]) -> Leaf {
        self.leaf(sans, ExtendedKeyUsagePurpose::ServerAuth)
    }

    /// A client certificate for `sans`.
    pub fn client(&self, sans: &[&str]) -> Leaf {
        self.leaf(sans, ExtendedKeyUsagePurpose::ClientAuth)
    }

    /// A certificate for `sans` usable on both ends, as Envoy Gateway gives the rate
    /// limit service one `tls.crt` for its gRPC port and its xDS client.
    pub fn server_and_client(&self, sans: &[&str]) -> Leaf {
        self.leaf_for(
            sans,
            vec![
                ExtendedKeyUsagePurpose::ServerAuth,
                ExtendedKeyUsagePurpose::ClientAuth,
            ],
        )
    }

    fn leaf(&self, sans: &[&str], usage: ExtendedKeyUsagePurpose) -> Leaf {
        self.leaf_for(sans, vec![usage])
    }

    fn leaf_for(&self, sans: &[&str], usages: Vec<ExtendedKeyUsagePurpose>) -> Leaf {
        let sans: Vec<String> = sans.iter().map(|s| (*s).to_owned()).collect();
        let mut params = CertificateParams::new(sans).expect("leaf params");
        params.extended_key_usages = usages;
        let key = KeyPair::generate().expect("leaf key");
        let cert = params.signed_by(&key, &self.issuer).expect("sign leaf");
        Leaf {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        }
    }
}

impl Leaf {
    /// Writes `<name>.crt` and `<name>.key` into `dir`; returns their paths.
    pub fn write(&self, dir: &Path, name: &str) -> (PathBuf, PathBuf) {
        let cert = dir.join(format!("{name}.crt"));
        let key = dir.join(format!("{name}.key"));
        write_atomic(&cert, &self.cert_pem);
        write_atomic(&key, &self.key_pem);
        (cert, key)
    }
}

/// Writes through a temporary file and a rename, as certificate rotation tools do.
pub fn write_atomic(path: &Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).expect("write pem");
    std::fs::rename(&tmp, path).expect("rename pem");
}
