//! The throw-away PKI of one test control plane: a CA, the API server's serving
//! certificate, the admin client certificate and the service-account signing key. The same
//! CA signs the serving certificates of the webhook servers (CAPI's managers) that the API
//! server calls, as envtest does.
//!
//! `cargo xtask host up` uses it for the test libvirtd's TLS listener: [`Pki::new_ca`] makes its CA once, and tests load that CA back with
//! [`Pki::load_ca`] to sign client certificates (see `remote_access`).

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose,
};

/// The files written by [`Pki::generate`], all PEM.
pub struct PkiFiles {
    pub ca_cert: PathBuf,
    pub serving_cert: PathBuf,
    pub serving_key: PathBuf,
    pub admin_cert: PathBuf,
    pub admin_key: PathBuf,
    pub service_account_key: PathBuf,
    pub service_account_public_key: PathBuf,
}

/// A certificate authority that signs serving and client certificates.
pub struct Pki {
    issuer: Issuer<'static, KeyPair>,
    ca_pem: String,
}

impl Pki {
    pub fn new_ca(common_name: &str) -> Result<Self> {
        let key = KeyPair::generate()?;
        let params = ca_params(common_name)?;
        let cert = params.self_signed(&key)?;
        Ok(Self { ca_pem: cert.pem(), issuer: Issuer::new(params, key) })
    }

    /// The CA that [`Pki::new_ca`]`(common_name)` made, from its certificate and
    /// key as [`Pki::ca_pem`] and [`Pki::ca_key_pem`] gave them. The certificates
    /// it signs chain to that CA certificate: an issuer is its subject name and
    /// its key, and both are the same.
    pub fn load_ca(common_name: &str, ca_pem: &str, key_pem: &str) -> Result<Self> {
        let key = KeyPair::from_pem(key_pem).context("reading the CA key (PEM)")?;
        Ok(Self { ca_pem: ca_pem.to_owned(), issuer: Issuer::new(ca_params(common_name)?, key) })
    }

    /// The CA's private key (PEM).
    pub fn ca_key_pem(&self) -> String {
        self.issuer.key().serialize_pem()
    }

    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// A serving certificate for `localhost` and `127.0.0.1`: `(cert_pem, key_pem)`.
    pub fn serving_cert(&self, common_name: &str) -> Result<(String, String)> {
        self.serving_cert_for(common_name, &["localhost".to_owned(), "127.0.0.1".to_owned()])
    }

    /// A serving certificate for these DNS names and IP addresses: `(cert_pem, key_pem)`.
    pub fn serving_cert_for(&self, common_name: &str, names: &[String]) -> Result<(String, String)> {
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::new(names.to_vec())?;
        params.distinguished_name.push(DnType::CommonName, common_name);
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let cert = params.signed_by(&key, &self.issuer)?;
        Ok((cert.pem(), key.serialize_pem()))
    }

    /// A client certificate for user `user` in group `group`: `(cert_pem, key_pem)`.
    pub fn client_cert(&self, user: &str, group: &str) -> Result<(String, String)> {
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.distinguished_name.push(DnType::CommonName, user);
        params.distinguished_name.push(DnType::OrganizationName, group);
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let cert = params.signed_by(&key, &self.issuer)?;
        Ok((cert.pem(), key.serialize_pem()))
    }

    /// Generates everything kube-apiserver needs into `dir`; returns the CA too, which
    /// later signs the serving certificates of webhook servers the API server calls.
    pub fn generate(dir: &Path) -> Result<(Self, PkiFiles)> {
        let pki = Self::new_ca("capl-testenv-ca")?;
        let (serving_cert, serving_key) = pki.serving_cert("kube-apiserver")?;
        // system:masters is the group kube-apiserver always authorizes for everything.
        let (admin_cert, admin_key) = pki.client_cert("capl-testenv-admin", "system:masters")?;
        let service_account = KeyPair::generate()?;
        let files = PkiFiles {
            ca_cert: dir.join("ca.crt"),
            serving_cert: dir.join("apiserver.crt"),
            serving_key: dir.join("apiserver.key"),
            admin_cert: dir.join("admin.crt"),
            admin_key: dir.join("admin.key"),
            service_account_key: dir.join("sa.key"),
            service_account_public_key: dir.join("sa.pub"),
        };
        for (path, pem) in [
            (&files.ca_cert, pki.ca_pem().to_owned()),
            (&files.serving_cert, serving_cert),
            (&files.serving_key, serving_key),
            (&files.admin_cert, admin_cert),
            (&files.admin_key, admin_key),
            (&files.service_account_key, service_account.serialize_pem()),
            (&files.service_account_public_key, service_account.public_key_pem()),
        ] {
            std::fs::write(path, pem).with_context(|| format!("writing {}", path.display()))?;
        }
        Ok((pki, files))
    }
}

/// The parameters of a CA certificate named `common_name`: [`Pki::new_ca`]
/// signs with them, and [`Pki::load_ca`] issues with them again.
fn ca_params(common_name: &str) -> Result<CertificateParams> {
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
    params.distinguished_name.push(DnType::CommonName, common_name);
    Ok(params)
}
