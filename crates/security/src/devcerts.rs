//! Throwaway certificates and tokens for trying a secure cluster on one
//! machine (`leasehold dev-certs DIR`): a CA, one certificate per node
//! (`leasehold://node/ID`, usable as server and client), one client
//! certificate, and a token per role. Files holding keys or tokens are
//! written mode 0600.
//!
//! A directory that already holds `ca.pem` and `ca.key` keeps its CA and
//! its tokens, so running the command again with a larger `--nodes` adds
//! certificates that a running cluster already trusts.

use std::io::Write;
use std::net::IpAddr;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType, date_time_ymd,
};

use crate::identity::{CLIENT_URI_PREFIX, NODE_URI_PREFIX};
use crate::tokens::{Role, generate_token, toml_entry};

/// What to write.
#[derive(Clone, Debug)]
pub struct DevCerts {
    /// The directory (created if missing).
    pub dir: PathBuf,
    /// Node certificates `node-1` … `node-N`.
    pub nodes: u64,
    /// Extra host names or addresses every node certificate carries, besides
    /// `127.0.0.1` and `localhost`.
    pub hosts: Vec<String>,
}

/// Why the files could not be written.
#[derive(Debug, thiserror::Error)]
pub enum DevCertsError {
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The IO error.
        source: std::io::Error,
    },
    /// rcgen refused a name or could not sign.
    #[error("{what}: {source}")]
    Certificate {
        /// What was being made.
        what: String,
        /// Why.
        source: rcgen::Error,
    },
    /// Bad options.
    #[error("{0}")]
    Invalid(String),
}

/// What was written.
#[derive(Debug, Default)]
pub struct Written {
    /// Every file written, in order.
    pub files: Vec<PathBuf>,
    /// The CA (and tokens) already there were kept.
    pub kept_ca: bool,
}

fn cert_error(what: impl Into<String>) -> impl FnOnce(rcgen::Error) -> DevCertsError {
    let what = what.into();
    move |source| DevCertsError::Certificate { what, source }
}

fn write_file(path: &Path, contents: &[u8], secret: bool) -> Result<(), DevCertsError> {
    let io = |source| DevCertsError::Io { path: path.to_path_buf(), source };
    // Not through a link someone else planted (a shared directory): the
    // keys and tokens would go where that link points. This check names
    // the file; what makes it safe is below.
    if std::fs::symlink_metadata(path).is_ok_and(|meta| meta.file_type().is_symlink()) {
        return Err(io(std::io::Error::other(
            "is a symbolic link; dev-certs writes keys and tokens only to plain files",
        )));
    }
    replace_file(path, contents, if secret { 0o600 } else { 0o644 }).map_err(io)
}

/// Writes `contents` to a fresh file under a random name (`create_new`
/// opens no existing file or link, so a link planted there is refused, not
/// followed), then renames it over `path`: a rename replaces a link itself,
/// never what it points to. The file has its mode from birth.
fn replace_file(path: &Path, contents: &[u8], mode: u32) -> std::io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let temp = dir.join(format!(".{name}.{:016x}.tmp", rand::random::<u64>()));
    let mut options = std::fs::OpenOptions::new();
    options.create_new(true).write(true).mode(mode);
    let written = options.open(&temp).and_then(|mut file| {
        file.write_all(contents)?;
        file.sync_all()?;
        std::fs::rename(&temp, path)
    });
    if written.is_err() {
        let _ = std::fs::remove_file(&temp);
    }
    written?;
    std::fs::File::open(dir)?.sync_all()
}

/// The validity window: from the start of last year to the start of the
/// year after next (the clock is read once, here, outside any replica).
fn validity(params: &mut CertificateParams) {
    let seconds = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let year = 1970 + (seconds / 31_556_952) as i32;
    params.not_before = date_time_ymd(year - 1, 1, 1);
    params.not_after = date_time_ymd(year + 2, 1, 1);
}

fn san(name: &str) -> Result<SanType, DevCertsError> {
    match name.parse::<IpAddr>() {
        Ok(ip) => Ok(SanType::IpAddress(ip)),
        Err(_) => {
            Ok(SanType::DnsName(name.try_into().map_err(cert_error(format!("--host {name}")))?))
        }
    }
}

fn uri(text: String) -> Result<SanType, DevCertsError> {
    let what = format!("name {text}");
    Ok(SanType::URI(text.try_into().map_err(cert_error(what))?))
}

impl DevCerts {
    /// Writes the CA, the node and client certificates, and the tokens.
    pub fn write(&self) -> Result<Written, DevCertsError> {
        if self.nodes == 0 || self.nodes > 1_000 {
            return Err(DevCertsError::Invalid("--nodes: must be 1 ..= 1000".into()));
        }
        let dir = &self.dir;
        std::fs::create_dir_all(dir)
            .map_err(|source| DevCertsError::Io { path: dir.clone(), source })?;
        let mut written = Written::default();
        let ca_pem_path = dir.join("ca.pem");
        let ca_key_path = dir.join("ca.key");
        if ca_pem_path.exists() != ca_key_path.exists() {
            // A CA whose key was taken away (to keep it offline) is not to be
            // replaced by a new one: every node would stop trusting the rest.
            let (there, missing) =
                if ca_pem_path.exists() { ("ca.pem", "ca.key") } else { ("ca.key", "ca.pem") };
            return Err(DevCertsError::Invalid(format!(
                "{}: {there} is there but {missing} is not; put {missing} back to sign with this \
                 CA, or move {there} away to make a new one",
                dir.display()
            )));
        }
        let issuer = if ca_pem_path.exists() && ca_key_path.exists() {
            let read = |path: &Path| {
                std::fs::read_to_string(path)
                    .map_err(|source| DevCertsError::Io { path: path.to_path_buf(), source })
            };
            let key = KeyPair::from_pem(&read(&ca_key_path)?).map_err(cert_error("ca.key"))?;
            written.kept_ca = true;
            Issuer::from_ca_cert_pem(&read(&ca_pem_path)?, key).map_err(cert_error("ca.pem"))?
        } else {
            let key = KeyPair::generate().map_err(cert_error("CA key"))?;
            let mut params = CertificateParams::default();
            // A name of its own: two dev CAs in one trust bundle (during a
            // rotation) must not look like the same issuer to a verifier.
            let tag: String = crate::tokens::generate_token().chars().skip(3).take(12).collect();
            params.distinguished_name.push(DnType::CommonName, format!("leasehold dev CA {tag}"));
            params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
            params.key_usages = vec![
                KeyUsagePurpose::KeyCertSign,
                KeyUsagePurpose::CrlSign,
                KeyUsagePurpose::DigitalSignature,
            ];
            validity(&mut params);
            let certificate = params.self_signed(&key).map_err(cert_error("CA certificate"))?;
            write_file(&ca_pem_path, certificate.pem().as_bytes(), false)?;
            write_file(&ca_key_path, key.serialize_pem().as_bytes(), true)?;
            written.files.push(ca_pem_path);
            written.files.push(ca_key_path);
            Issuer::new(params, key)
        };

        for id in 1..=self.nodes {
            let mut names = vec![SanType::IpAddress([127, 0, 0, 1].into()), san("localhost")?];
            for host in &self.hosts {
                names.push(san(host)?);
            }
            names.push(uri(format!("{NODE_URI_PREFIX}{id}"))?);
            let mut params = CertificateParams::default();
            params.subject_alt_names = names;
            params.distinguished_name.push(DnType::CommonName, format!("leasehold node {id}"));
            params.extended_key_usages =
                vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth];
            params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
            validity(&mut params);
            let name = format!("node-{id}");
            self.leaf(&params, &issuer, &name, &mut written)?;
        }

        let mut params = CertificateParams::default();
        params.subject_alt_names = vec![uri(format!("{CLIENT_URI_PREFIX}client"))?];
        params.distinguished_name.push(DnType::CommonName, "leasehold client");
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        validity(&mut params);
        self.leaf(&params, &issuer, "client", &mut written)?;

        let tokens_path = dir.join("tokens.toml");
        if !(written.kept_ca && tokens_path.exists()) {
            let mut file = String::from(
                "# leasehold client tokens (SHA-256 hashes; the tokens are in token-ROLE).\n",
            );
            for role in Role::ALL {
                let token = generate_token();
                file.push('\n');
                file.push_str(&toml_entry(&format!("dev-{}", role.name()), &[role], &token));
                let path = dir.join(format!("token-{}", role.name()));
                write_file(&path, format!("{token}\n").as_bytes(), true)?;
                written.files.push(path);
            }
            write_file(&tokens_path, file.as_bytes(), true)?;
            written.files.push(tokens_path);
        }
        Ok(written)
    }

    fn leaf(
        &self,
        params: &CertificateParams,
        issuer: &Issuer<'_, KeyPair>,
        name: &str,
        written: &mut Written,
    ) -> Result<(), DevCertsError> {
        let key = KeyPair::generate().map_err(cert_error(format!("{name} key")))?;
        let certificate =
            params.signed_by(&key, issuer).map_err(cert_error(format!("{name} certificate")))?;
        let pem_path = self.dir.join(format!("{name}.pem"));
        let key_path = self.dir.join(format!("{name}.key"));
        write_file(&pem_path, certificate.pem().as_bytes(), false)?;
        write_file(&key_path, key.serialize_pem().as_bytes(), true)?;
        written.files.push(pem_path);
        written.files.push(key_path);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;
    use crate::identity::Identity;
    use crate::tls::TlsFiles;
    use crate::tokens::TokenSet;

    fn mode(path: &Path) -> u32 {
        std::fs::metadata(path).map(|m| m.permissions().mode() & 0o777).unwrap_or(0)
    }

    #[test]
    fn half_a_ca_is_refused_and_nothing_is_written() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let out = dir.path().join("certs");
        let certs = || DevCerts { dir: out.clone(), nodes: 1, hosts: Vec::new() };
        certs().write()?;
        let ca = std::fs::read(out.join("ca.pem"))?;
        let token = std::fs::read(out.join("token-admin"))?;
        std::fs::rename(out.join("ca.key"), dir.path().join("offline.key"))?;
        match certs().write() {
            Err(DevCertsError::Invalid(message)) => {
                assert!(message.contains("ca.key"), "{message}")
            }
            other => panic!("a CA without its key was replaced: {other:?}"),
        }
        assert_eq!(std::fs::read(out.join("ca.pem"))?, ca);
        assert_eq!(std::fs::read(out.join("token-admin"))?, token);
        assert!(!out.join("ca.key").exists());
        Ok(())
    }

    #[test]
    fn dev_certs_name_nodes_and_clients_and_lock_their_secrets()
    -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let out = dir.path().join("certs");
        let first =
            DevCerts { dir: out.clone(), nodes: 2, hosts: vec!["db.example".into()] }.write()?;
        assert!(!first.kept_ca);
        for id in 1..=2u64 {
            let files = TlsFiles {
                ca: out.join("ca.pem"),
                cert: out.join(format!("node-{id}.pem")),
                key: out.join(format!("node-{id}.key")),
            };
            assert_eq!(files.load()?.identity(), &Identity::Node(id));
            assert_eq!(mode(&files.key), 0o600);
            assert_eq!(mode(&files.cert), 0o644);
        }
        let client = TlsFiles {
            ca: out.join("ca.pem"),
            cert: out.join("client.pem"),
            key: out.join("client.key"),
        };
        assert_eq!(client.load()?.identity(), &Identity::Client("client".into()));
        let tokens = TokenSet::from_file(&out.join("tokens.toml"))?;
        for role in Role::ALL {
            let path = out.join(format!("token-{}", role.name()));
            assert_eq!(mode(&path), 0o600);
            let token = std::fs::read_to_string(&path)?;
            let entry = tokens.authenticate(token.trim());
            assert!(entry.is_some_and(|e| e.roles == vec![role]), "{role}");
        }
        assert_eq!(mode(&out.join("ca.key")), 0o600);
        assert_eq!(mode(&out.join("tokens.toml")), 0o600);

        let admin_before = std::fs::read_to_string(out.join("token-admin"))?;
        let again = DevCerts { dir: out.clone(), nodes: 3, hosts: Vec::new() }.write()?;
        assert!(again.kept_ca, "a second run keeps the CA");
        assert_eq!(std::fs::read_to_string(out.join("token-admin"))?, admin_before);
        let third = TlsFiles {
            ca: out.join("ca.pem"),
            cert: out.join("node-3.pem"),
            key: out.join("node-3.key"),
        };
        assert_eq!(third.load()?.identity(), &Identity::Node(3));
        Ok(())
    }

    #[test]
    fn credentials_any_user_may_write_are_refused_by_flag() -> Result<(), Box<dyn std::error::Error>>
    {
        let dir = tempfile::tempdir()?;
        let out = dir.path().join("certs");
        DevCerts { dir: out.clone(), nodes: 1, hosts: Vec::new() }.write()?;
        let files = TlsFiles {
            ca: out.join("ca.pem"),
            cert: out.join("node-1.pem"),
            key: out.join("node-1.key"),
        };
        let tokens = out.join("tokens.toml");
        let loosen = |path: &Path, mode: u32| {
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        };
        for (path, flag, kept) in [
            (&files.ca, "--tls-ca", 0o644),
            (&files.cert, "--tls-cert", 0o644),
            (&files.key, "--tls-key", 0o600),
        ] {
            loosen(path, 0o666)?;
            let refused = files.load().err().map(|e| e.to_string()).unwrap_or_default();
            assert!(refused.starts_with(flag) && refused.contains("0666"), "{refused}");
            loosen(path, kept)?;
        }
        loosen(&files.key, 0o644)?;
        assert!(files.load().is_ok(), "a key others may read is taken, and reported");
        loosen(&tokens, 0o662)?;
        let refused = TokenSet::from_file(&tokens).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(refused.starts_with("--tokens") && refused.contains("0662"), "{refused}");
        loosen(&tokens, 0o664)?;
        assert!(TokenSet::from_file(&tokens).is_ok(), "a group-writable file is reported");
        Ok(())
    }

    #[test]
    fn a_key_is_not_written_through_a_planted_link() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let out = dir.path().join("certs");
        std::fs::create_dir_all(&out)?;
        let elsewhere = dir.path().join("attacker-reads-this");
        std::os::unix::fs::symlink(&elsewhere, out.join("node-1.key"))?;
        let refused = DevCerts { dir: out.clone(), nodes: 1, hosts: Vec::new() }.write();
        let message = refused.err().map(|e| e.to_string()).unwrap_or_default();
        assert!(message.contains("node-1.key") && message.contains("symbolic link"), "{message}");
        assert!(!elsewhere.exists(), "the key went through the link");
        Ok(())
    }

    #[test]
    fn a_link_planted_after_the_check_is_replaced_not_followed()
    -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let elsewhere = dir.path().join("attacker-reads-this");
        std::fs::write(&elsewhere, b"")?;
        let key = dir.path().join("node-1.key");
        std::os::unix::fs::symlink(&elsewhere, &key)?;
        super::replace_file(&key, b"secret key", 0o600)?;
        assert_eq!(std::fs::read(&elsewhere)?, b"", "the key went through the link");
        assert!(!std::fs::symlink_metadata(&key)?.file_type().is_symlink());
        assert_eq!(std::fs::read(&key)?, b"secret key");
        assert_eq!(mode(&key), 0o600);
        let left: Vec<_> = std::fs::read_dir(dir.path())?.collect();
        assert_eq!(left.len(), 2, "no temporary file is left behind");
        Ok(())
    }

    #[test]
    fn a_key_that_is_not_the_certificates_is_refused_at_load()
    -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        DevCerts { dir: dir.path().to_path_buf(), nodes: 2, hosts: Vec::new() }.write()?;
        let mixed = TlsFiles {
            ca: dir.path().join("ca.pem"),
            cert: dir.path().join("node-1.pem"),
            key: dir.path().join("node-2.key"),
        };
        let error = mixed.load().err().map(|e| e.to_string()).unwrap_or_default();
        assert!(error.contains("certificate and key"), "{error}");
        let missing = TlsFiles { ca: dir.path().join("nope.pem"), ..mixed };
        let error = missing.load().err().map(|e| e.to_string()).unwrap_or_default();
        assert!(error.starts_with("--tls-ca"), "{error}");
        Ok(())
    }
}
