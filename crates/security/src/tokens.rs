//! Client tokens and their roles.
//!
//! A node started with `--tokens FILE` asks every client call for
//! `authorization: Bearer TOKEN`. The file holds only SHA-256 hashes of the
//! tokens, never the tokens, so reading it does not let anyone in:
//!
//! ```toml
//! [[tokens]]
//! name = "deploy-bot"
//! roles = ["producer"]
//! sha256 = "5e884898da28047151d0e56f8dc6292773603d0d6aabbdd62a11ef721d1542d8"
//! ```
//!
//! A presented token is hashed and compared with every entry in constant
//! time. The file is read again on SIGHUP, so tokens rotate without a
//! restart: add the new one, move clients over, remove the old one.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use rand::RngCore;
use serde::Deserialize;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// What a token may do. Every role includes `reader`; `admin` includes
/// every role.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Cluster changes, schedules, and anything that runs a command (the
    /// command queues and schedules with a `command`).
    Admin,
    /// Enqueue on queues that are not command queues; redrive.
    Producer,
    /// Claim, refresh, ack, nack and release.
    Worker,
    /// Get, list, stats and status.
    Reader,
}

impl Role {
    /// Every role, most powerful first.
    pub const ALL: [Role; 4] = [Role::Admin, Role::Producer, Role::Worker, Role::Reader];

    /// The role's name as written in the tokens file.
    pub fn name(self) -> &'static str {
        match self {
            Role::Admin => "admin",
            Role::Producer => "producer",
            Role::Worker => "worker",
            Role::Reader => "reader",
        }
    }

    /// Whether holding `self` allows what `needed` allows.
    pub fn grants(self, needed: Role) -> bool {
        self == needed || self == Role::Admin || needed == Role::Reader
    }
}

impl std::fmt::Display for Role {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// One token of the file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TokenEntry {
    /// A label for logs (never the token).
    pub name: String,
    /// What the token may do.
    pub roles: Vec<Role>,
    hash: [u8; 32],
}

impl TokenEntry {
    /// Whether any of the token's roles allows what `needed` allows.
    pub fn grants(&self, needed: Role) -> bool {
        self.roles.iter().any(|role| role.grants(needed))
    }

    /// The roles, comma-separated, for messages.
    pub fn role_names(&self) -> String {
        self.roles.iter().map(|r| r.name()).collect::<Vec<_>>().join(",")
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TokenFile {
    #[serde(default)]
    tokens: Vec<RawEntry>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawEntry {
    name: String,
    roles: Vec<Role>,
    sha256: String,
}

/// Why a tokens file could not be used; names the file and the entry.
#[derive(Debug, thiserror::Error)]
pub enum TokensError {
    /// The file could not be read.
    #[error("--tokens {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The IO error.
        source: std::io::Error,
    },
    /// A file any user may write (and so fill with their own admin token).
    #[error("--tokens {path}: {source}")]
    Mode {
        /// The file.
        path: PathBuf,
        /// Its mode.
        source: crate::file_mode::WritableByAnyone,
    },
    /// Not TOML of the expected shape.
    #[error("--tokens {path}: {problem}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// The parse error (names the key).
        problem: String,
    },
    /// An entry is unusable.
    #[error("--tokens {path}: {field}: {problem}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// The entry and key, like `tokens[2].sha256`.
        field: String,
        /// What is wrong.
        problem: String,
    },
}

/// The hex SHA-256 of a token, as the tokens file stores it.
pub fn hash_token(token: &str) -> String {
    hex(&Sha256::digest(token.as_bytes()))
}

/// A fresh random token (hex, 256 bits).
pub fn generate_token() -> String {
    let mut raw = [0u8; 32];
    rand::thread_rng().fill_bytes(&mut raw);
    format!("lh_{}", hex(&raw))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> Option<[u8; 32]> {
    let text = text.trim();
    if text.len() != 64 || !text.is_ascii() {
        return None;
    }
    let mut out = [0u8; 32];
    for (index, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&text[2 * index..2 * index + 2], 16).ok()?;
    }
    Some(out)
}

/// The tokens a node accepts.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TokenSet {
    entries: Vec<TokenEntry>,
}

impl TokenSet {
    /// Reads and checks a tokens file.
    pub fn from_file(path: &Path) -> Result<TokenSet, TokensError> {
        let unreadable = |source| TokensError::Read { path: path.to_path_buf(), source };
        if let Err(source) = crate::file_mode::check(path, false).map_err(unreadable)? {
            return Err(TokensError::Mode { path: path.to_path_buf(), source });
        }
        let text = std::fs::read_to_string(path)
            .map_err(|source| TokensError::Read { path: path.to_path_buf(), source })?;
        TokenSet::from_toml(&text, path)
    }

    /// Parses tokens-file text (`path` names it in errors).
    pub fn from_toml(text: &str, path: &Path) -> Result<TokenSet, TokensError> {
        let file: TokenFile = toml::from_str(text)
            .map_err(|e| TokensError::Parse { path: path.to_path_buf(), problem: e.to_string() })?;
        let invalid = |index: usize, key: &str, problem: &str| TokensError::Invalid {
            path: path.to_path_buf(),
            field: format!("tokens[{index}].{key}"),
            problem: problem.to_string(),
        };
        let mut entries: Vec<TokenEntry> = Vec::with_capacity(file.tokens.len());
        for (index, raw) in file.tokens.into_iter().enumerate() {
            if raw.name.trim().is_empty() {
                return Err(invalid(index, "name", "must not be empty"));
            }
            if entries.iter().any(|e| e.name == raw.name) {
                return Err(invalid(index, "name", "is used by an earlier entry"));
            }
            if raw.roles.is_empty() {
                return Err(invalid(index, "roles", "must name at least one role"));
            }
            let Some(hash) = unhex(&raw.sha256) else {
                return Err(invalid(
                    index,
                    "sha256",
                    "must be the 64 hex digits of the token's SHA-256",
                ));
            };
            if entries.iter().any(|e| e.hash == hash) {
                return Err(invalid(index, "sha256", "is the same token as an earlier entry"));
            }
            entries.push(TokenEntry { name: raw.name, roles: raw.roles, hash });
        }
        Ok(TokenSet { entries })
    }

    /// The entry of `token`, if it is one of the set. Every entry is
    /// compared, in constant time, whatever matches.
    pub fn authenticate(&self, token: &str) -> Option<&TokenEntry> {
        let presented: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        let mut found = None;
        for entry in &self.entries {
            if bool::from(entry.hash.ct_eq(&presented)) {
                found = Some(entry);
            }
        }
        found
    }

    /// How many tokens the set holds.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether the set holds no token (every call is then refused).
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// The token set a running node uses; replaced on reload.
#[derive(Clone, Debug)]
pub struct SharedTokens {
    current: Arc<RwLock<Arc<TokenSet>>>,
}

impl SharedTokens {
    /// Starts with `tokens`.
    pub fn new(tokens: TokenSet) -> SharedTokens {
        SharedTokens { current: Arc::new(RwLock::new(Arc::new(tokens))) }
    }

    /// The set in force now.
    pub fn current(&self) -> Arc<TokenSet> {
        match self.current.read() {
            Ok(guard) => guard.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    /// Replaces the set for every later call.
    pub fn replace(&self, tokens: TokenSet) {
        let tokens = Arc::new(tokens);
        match self.current.write() {
            Ok(mut guard) => *guard = tokens,
            Err(poisoned) => *poisoned.into_inner() = tokens,
        }
    }
}

/// One line of a tokens file for `token` (what `dev-certs` writes).
pub fn toml_entry(name: &str, roles: &[Role], token: &str) -> String {
    let roles: Vec<String> = roles.iter().map(|r| format!("{:?}", r.name())).collect();
    format!(
        "[[tokens]]\nname = {name:?}\nroles = [{}]\nsha256 = {:?}\n",
        roles.join(", "),
        hash_token(token)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_authenticates_by_its_hash_and_carries_its_roles() -> Result<(), TokensError> {
        let text = format!(
            "{}\n{}",
            toml_entry("ops", &[Role::Admin], "admin-token"),
            toml_entry("bot", &[Role::Producer, Role::Worker], "bot-token")
        );
        let set = TokenSet::from_toml(&text, Path::new("tokens.toml"))?;
        assert_eq!(set.len(), 2);
        let admin = set.authenticate("admin-token").map(|e| e.name.as_str());
        assert_eq!(admin, Some("ops"));
        let bot = set.authenticate("bot-token").ok_or_else(|| TokensError::Parse {
            path: PathBuf::new(),
            problem: "bot token not found".into(),
        })?;
        assert!(bot.grants(Role::Producer) && bot.grants(Role::Worker) && bot.grants(Role::Reader));
        assert!(!bot.grants(Role::Admin));
        assert!(set.authenticate("admin-token ").is_none(), "no trimming, no prefix match");
        assert!(set.authenticate("").is_none());
        assert!(!text.contains("admin-token"), "the file holds hashes only");
        Ok(())
    }

    #[test]
    fn roles_include_reader_and_admin_includes_all() {
        for role in Role::ALL {
            assert!(role.grants(Role::Reader), "{role}");
            assert!(Role::Admin.grants(role), "{role}");
            assert!(role.grants(role));
        }
        assert!(!Role::Producer.grants(Role::Worker));
        assert!(!Role::Worker.grants(Role::Producer));
        assert!(!Role::Reader.grants(Role::Worker));
        assert!(!Role::Producer.grants(Role::Admin));
    }

    #[test]
    fn bad_entries_are_refused_by_field() {
        let path = Path::new("t.toml");
        let refused = |text: &str| {
            TokenSet::from_toml(text, path).err().map(|e| e.to_string()).unwrap_or_default()
        };
        let hash = hash_token("x");
        let e = refused(&format!("[[tokens]]\nname = \"a\"\nroles = []\nsha256 = \"{hash}\"\n"));
        assert!(e.contains("tokens[0].roles"), "{e}");
        let e = refused("[[tokens]]\nname = \"a\"\nroles = [\"admin\"]\nsha256 = \"abc\"\n");
        assert!(e.contains("tokens[0].sha256"), "{e}");
        let e = refused(&format!(
            "[[tokens]]\nname = \"a\"\nroles = [\"root\"]\nsha256 = \"{hash}\"\n"
        ));
        assert!(e.contains("root"), "{e}");
        let twice = format!(
            "{}{}",
            toml_entry("a", &[Role::Admin], "x"),
            toml_entry("b", &[Role::Reader], "x")
        );
        assert!(refused(&twice).contains("tokens[1].sha256"));
        let e =
            refused("[[tokens]]\nname = \"a\"\nroles = [\"admin\"]\nsha256 = \"x\"\nextra = 1\n");
        assert!(e.contains("extra"), "{e}");
        assert!(TokenSet::from_toml("", path).is_ok_and(|s| s.is_empty()));
    }

    #[test]
    fn generated_tokens_differ_and_hash_to_64_hex_digits() {
        let (a, b) = (generate_token(), generate_token());
        assert_ne!(a, b);
        assert_eq!(hash_token(&a).len(), 64);
        assert_eq!(unhex(&hash_token(&a)).map(|h| h.len()), Some(32));
    }
}
