//! A group: the name and shared secret that make hosts members of one
//! storage network, and the keys derived from them
//! (`docs/native-transport.md`, "Group discovery").
//!
//! The secret is hashed to 32 bytes (`BLAKE2s-256(secret)`); each key is a
//! keyed BLAKE2s-256 of a distinct label, a 1-byte length and the group
//! name under that hash:
//!
//! | key | label |
//! |---|---|
//! | Noise PSK (handshake) | `ethersan/1 psk` |
//! | discovery MAC key | `ethersan/1 discovery mac` |
//! | discovery reply key | `ethersan/1 discovery reply` |
//!
//! Two groups with the same secret but different names share no key.

use std::path::Path;

use blake2::digest::{FixedOutput, KeyInit, Mac};
use blake2::{Blake2s256, Blake2sMac256, Digest};
use zeroize::Zeroize;

/// Longest group name, in bytes of UTF-8.
pub const MAX_GROUP_NAME: usize = 64;

/// Shortest group secret accepted, in bytes.
pub const MIN_SECRET: usize = 8;

/// Longest group secret accepted, in bytes (a secret file larger than this
/// is surely not one).
pub const MAX_SECRET: usize = 4096;

/// The environment variable holding a group secret.
pub const SECRET_ENV: &str = "ETHERSAN_GROUP_SECRET";

const LABEL_PSK: &[u8] = b"ethersan/1 psk";
const LABEL_DISCOVERY_MAC: &[u8] = b"ethersan/1 discovery mac";
const LABEL_DISCOVERY_REPLY: &[u8] = b"ethersan/1 discovery reply";
/// Label of the stateless reset key (docs/native-transport.md §Stateless
/// reset).
const LABEL_RESET: &[u8] = b"ethersan reset v1";

/// A group name or secret that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum GroupError {
    /// The group name is empty.
    #[error("the group name is empty: give the name of the storage group (e.g. \"lab\")")]
    NameEmpty,
    /// The group name is too long.
    #[error("the group name is {len} bytes long: use at most {MAX_GROUP_NAME}")]
    NameTooLong {
        /// Its length in bytes.
        len: usize,
    },
    /// The group name holds a control character or starts or ends with
    /// white space.
    #[error(
        "the group name {name:?} is not printable: use letters, digits and punctuation, \
         without control characters or white space at its ends"
    )]
    NameNotPrintable {
        /// The name as given.
        name: String,
    },
    /// The secret is empty.
    #[error("{from} is empty: a group secret needs at least {MIN_SECRET} bytes (e.g. `head -c 32 /dev/urandom | base64`)")]
    SecretEmpty {
        /// Where the secret came from.
        from: String,
    },
    /// The secret is too short.
    #[error("{from} is only {len} bytes: a group secret needs at least {MIN_SECRET} (e.g. `head -c 32 /dev/urandom | base64`)")]
    SecretTooShort {
        /// Where the secret came from.
        from: String,
        /// Its length in bytes.
        len: usize,
    },
    /// The secret is too long.
    #[error("{from} is longer than {MAX_SECRET} bytes: is it really the group secret?")]
    SecretTooLong {
        /// Where the secret came from.
        from: String,
    },
    /// A secret file could not be read.
    #[error("group secret file {path}: {source}")]
    File {
        /// The file.
        path: String,
        /// Why it could not be read.
        source: std::io::Error,
    },
    /// No secret was given anywhere.
    #[error(
        "no group secret: give --group-secret-file FILE, set {SECRET_ENV} or set secret_file in [ethernet]"
    )]
    NoSecret,
}

/// A group's name and the keys derived from its secret. `Debug` shows the
/// name only.
#[derive(Clone)]
pub struct GroupKeys {
    group: String,
    psk: [u8; 32],
    discovery_mac: [u8; 32],
    discovery_reply: [u8; 32],
    reset: [u8; 32],
}

impl std::fmt::Debug for GroupKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GroupKeys")
            .field("group", &self.group)
            .finish_non_exhaustive()
    }
}

impl Drop for GroupKeys {
    fn drop(&mut self) {
        self.psk.zeroize();
        self.discovery_mac.zeroize();
        self.discovery_reply.zeroize();
        self.reset.zeroize();
    }
}

/// Checks a group name: 1 to [`MAX_GROUP_NAME`] bytes, no control
/// characters, no white space at its ends.
pub fn check_group_name(group: &str) -> Result<(), GroupError> {
    if group.is_empty() {
        return Err(GroupError::NameEmpty);
    }
    if group.len() > MAX_GROUP_NAME {
        return Err(GroupError::NameTooLong { len: group.len() });
    }
    if group.chars().any(char::is_control) || group.trim() != group {
        return Err(GroupError::NameNotPrintable {
            name: group.to_string(),
        });
    }
    Ok(())
}

fn check_secret(secret: &[u8], from: &str) -> Result<(), GroupError> {
    let from = from.to_string();
    match secret.len() {
        0 => Err(GroupError::SecretEmpty { from }),
        len if len < MIN_SECRET => Err(GroupError::SecretTooShort { from, len }),
        len if len > MAX_SECRET => Err(GroupError::SecretTooLong { from }),
        _ => Ok(()),
    }
}

fn derive_key(root: &[u8; 32], label: &[u8], group: &str) -> [u8; 32] {
    let mut mac = <Blake2sMac256 as KeyInit>::new_from_slice(root)
        .unwrap_or_else(|_| unreachable!("a 32-byte key fits BLAKE2s"));
    mac.update(label);
    // The name is at most 64 bytes (checked by the caller).
    mac.update(&[group.len() as u8]);
    mac.update(group.as_bytes());
    mac.finalize_fixed().into()
}

impl GroupKeys {
    /// The keys of group `group` with secret `secret`. Fails on a name
    /// that is empty, longer than [`MAX_GROUP_NAME`] bytes or not
    /// printable, and on a secret shorter than [`MIN_SECRET`] bytes or
    /// longer than [`MAX_SECRET`].
    pub fn derive(group: &str, secret: &[u8]) -> Result<GroupKeys, GroupError> {
        check_group_name(group)?;
        check_secret(secret, "the group secret")?;
        let mut root: [u8; 32] = Blake2s256::digest(secret).into();
        let keys = GroupKeys {
            group: group.to_string(),
            psk: derive_key(&root, LABEL_PSK, group),
            discovery_mac: derive_key(&root, LABEL_DISCOVERY_MAC, group),
            discovery_reply: derive_key(&root, LABEL_DISCOVERY_REPLY, group),
            reset: derive_key(&root, LABEL_RESET, group),
        };
        root.zeroize();
        Ok(keys)
    }

    /// The group's name.
    pub fn group(&self) -> &str {
        &self.group
    }

    /// The Noise pre-shared key of the handshake.
    pub fn psk(&self) -> &[u8; 32] {
        &self.psk
    }

    /// The key of the discovery query MAC (keyed BLAKE2s-256).
    pub fn discovery_mac_key(&self) -> &[u8; 32] {
        &self.discovery_mac
    }

    /// The ChaCha20-Poly1305 key of discovery replies.
    pub fn discovery_reply_key(&self) -> &[u8; 32] {
        &self.discovery_reply
    }

    /// The key of stateless reset tokens (keyed BLAKE2s-256).
    pub fn reset_key(&self) -> &[u8; 32] {
        &self.reset
    }
}

/// Reads a secret file, dropping one trailing newline (`\n` or `\r\n`).
fn read_secret_file(path: &Path) -> Result<Vec<u8>, GroupError> {
    let file_err = |source| GroupError::File {
        path: path.display().to_string(),
        source,
    };
    let meta = std::fs::metadata(path).map_err(file_err)?;
    let from = format!("group secret file {}", path.display());
    if meta.len() > MAX_SECRET as u64 + 2 {
        return Err(GroupError::SecretTooLong { from });
    }
    let mut secret = std::fs::read(path).map_err(file_err)?;
    if secret.last() == Some(&b'\n') {
        secret.pop();
        if secret.last() == Some(&b'\r') {
            secret.pop();
        }
    }
    if let Err(e) = check_secret(&secret, &from) {
        secret.zeroize();
        return Err(e);
    }
    Ok(secret)
}

/// Finds the group secret, in order of precedence: the file given on the
/// command line (`file`, `--group-secret-file`), the value of
/// [`SECRET_ENV`] (`env`, passed in by the caller, used as is), and the
/// file named by `secret_file` in the configuration's `[ethernet]` section
/// (`config_value`). A file loses one trailing newline. The secret must be
/// [`MIN_SECRET`] to [`MAX_SECRET`] bytes long; errors name where it came
/// from.
pub fn load_secret(
    file: Option<&Path>,
    env: Option<&str>,
    config_value: Option<&str>,
) -> Result<Vec<u8>, GroupError> {
    if let Some(path) = file {
        return read_secret_file(path);
    }
    if let Some(v) = env {
        check_secret(v.as_bytes(), SECRET_ENV)?;
        return Ok(v.as_bytes().to_vec());
    }
    if let Some(path) = config_value {
        return read_secret_file(Path::new(path));
    }
    Err(GroupError::NoSecret)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked() {
        assert!(matches!(
            GroupKeys::derive("", b"12345678"),
            Err(GroupError::NameEmpty)
        ));
        let long = "g".repeat(65);
        assert!(matches!(
            GroupKeys::derive(&long, b"12345678"),
            Err(GroupError::NameTooLong { len: 65 })
        ));
        assert!(GroupKeys::derive(&"g".repeat(64), b"12345678").is_ok());
        for bad in ["a\nb", "tab\t", " lead", "trail ", "\u{7f}"] {
            assert!(
                matches!(
                    GroupKeys::derive(bad, b"12345678"),
                    Err(GroupError::NameNotPrintable { .. })
                ),
                "{bad:?}"
            );
        }
        assert_eq!(
            GroupKeys::derive("lab 2 é", b"12345678").unwrap().group(),
            "lab 2 é"
        );
    }

    #[test]
    fn secrets_are_checked() {
        let e = GroupKeys::derive("lab", b"").unwrap_err();
        assert!(matches!(e, GroupError::SecretEmpty { .. }));
        let e = GroupKeys::derive("lab", b"1234567").unwrap_err();
        assert!(e.to_string().contains("only 7 bytes"), "{e}");
        assert!(e.to_string().contains("/dev/urandom"), "{e}");
    }

    #[test]
    fn keys_are_distinct_and_depend_on_name_and_secret() {
        let a = GroupKeys::derive("lab", b"secret-one").unwrap();
        let b = GroupKeys::derive("lab2", b"secret-one").unwrap();
        let c = GroupKeys::derive("lab", b"secret-two").unwrap();
        let a2 = GroupKeys::derive("lab", b"secret-one").unwrap();
        assert_eq!(a.psk(), a2.psk());
        assert_ne!(a.psk(), b.psk());
        assert_ne!(a.psk(), c.psk());
        assert_ne!(a.psk(), a.discovery_mac_key());
        assert_ne!(a.discovery_mac_key(), a.discovery_reply_key());
        assert_ne!(a.psk(), a.discovery_reply_key());
    }

    #[test]
    fn debug_hides_keys() {
        let a = GroupKeys::derive("lab", b"secret-one").unwrap();
        let s = format!("{a:?}");
        assert_eq!(s, "GroupKeys { group: \"lab\", .. }");
    }

    #[test]
    fn load_secret_precedence_and_errors() {
        let dir = std::env::temp_dir().join(format!("ethersan-group-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("secret");
        std::fs::write(&f, b"from-the-file\n").unwrap();
        let c = dir.join("config-secret");
        std::fs::write(&c, b"from-config\r\n").unwrap();
        let cs = c.to_str().unwrap();
        assert_eq!(
            load_secret(Some(&f), Some("from-env!"), Some(cs)).unwrap(),
            b"from-the-file"
        );
        assert_eq!(
            load_secret(None, Some("from-env!"), Some(cs)).unwrap(),
            b"from-env!"
        );
        assert_eq!(load_secret(None, None, Some(cs)).unwrap(), b"from-config");
        // Only one newline goes.
        std::fs::write(&f, b"two-newlines\n\n").unwrap();
        assert_eq!(
            load_secret(Some(&f), None, None).unwrap(),
            b"two-newlines\n"
        );

        let e = load_secret(None, None, None).unwrap_err();
        assert_eq!(
            e.to_string(),
            "no group secret: give --group-secret-file FILE, set ETHERSAN_GROUP_SECRET or set secret_file in [ethernet]"
        );
        let missing = dir.join("missing");
        let e = load_secret(Some(&missing), None, None).unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.starts_with(&format!(
                "group secret file {}: No such file",
                missing.display()
            )),
            "{msg}"
        );
        std::fs::write(&f, b"\n").unwrap();
        let e = load_secret(Some(&f), None, None).unwrap_err();
        assert!(matches!(e, GroupError::SecretEmpty { .. }), "{e}");
        assert!(e.to_string().starts_with("group secret file "), "{e}");
        let e = load_secret(None, Some("short"), None).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("ETHERSAN_GROUP_SECRET is only 5 bytes"),
            "{e}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
