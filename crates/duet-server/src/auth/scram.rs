//! SCRAM (RFC 5802 for SCRAM-SHA-1, RFC 7677 for SCRAM-SHA-256), the server
//! side: stored credentials and the two-message conversation.
//!
//! Invariants:
//! - Only salted, iterated keys are kept ([`Credentials`]: salt, iteration
//!   count, StoredKey, ServerKey); the password is used once, to derive them,
//!   and never stored.
//! - SCRAM-SHA-1 derives from MongoDB's password digest
//!   `hex(md5("<user>:mongo:<password>"))` (the drivers' authentication
//!   specification), SCRAM-SHA-256 from the SASLprep'd password (RFC 4013,
//!   the `stringprep` crate); passwords SASLprep prohibits are refused.
//! - The client proof is checked in constant time (`subtle`); a failed proof
//!   says nothing about which part was wrong.
//! - No panic on client input: every malformed message is a [`ScramError`].

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use bson::{doc, Document};
use hmac::{Hmac, KeyInit, Mac};
use sha1::Sha1;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// A SCRAM mechanism we speak.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mechanism {
    Sha1,
    Sha256,
}

/// Why a SCRAM step failed.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ScramError {
    /// The client's message does not follow RFC 5802.
    #[error("invalid SCRAM message: {0}")]
    Malformed(&'static str),
    /// Something we deliberately do not support (channel binding, authzid,
    /// passwords SASLprep prohibits).
    #[error("{0}")]
    Unsupported(&'static str),
    /// Wrong proof, or nonce/channel binding not echoed: authentication failed.
    #[error("Authentication failed.")]
    Failed,
}

impl Mechanism {
    pub const ALL: [Mechanism; 2] = [Mechanism::Sha1, Mechanism::Sha256];

    pub fn name(self) -> &'static str {
        match self {
            Mechanism::Sha1 => "SCRAM-SHA-1",
            Mechanism::Sha256 => "SCRAM-SHA-256",
        }
    }

    pub fn parse(name: &str) -> Option<Mechanism> {
        Mechanism::ALL.into_iter().find(|m| m.name() == name)
    }

    /// MongoDB's defaults (`scramIterationCount`, `scramSHA256IterationCount`).
    pub fn default_iterations(self) -> u32 {
        match self {
            Mechanism::Sha1 => 10_000,
            Mechanism::Sha256 => 15_000,
        }
    }

    fn salt_len(self) -> usize {
        match self {
            Mechanism::Sha1 => 16,
            Mechanism::Sha256 => 28,
        }
    }

    fn hash_len(self) -> usize {
        match self {
            Mechanism::Sha1 => 20,
            Mechanism::Sha256 => 32,
        }
    }

    fn h(self, data: &[u8]) -> Vec<u8> {
        match self {
            Mechanism::Sha1 => Sha1::digest(data).to_vec(),
            Mechanism::Sha256 => Sha256::digest(data).to_vec(),
        }
    }

    fn hmac(self, key: &[u8], data: &[u8]) -> Vec<u8> {
        // HMAC accepts keys of any length: the error arm cannot happen.
        match self {
            Mechanism::Sha1 => match <Hmac<Sha1> as KeyInit>::new_from_slice(key) {
                Ok(mut m) => {
                    m.update(data);
                    m.finalize().into_bytes().to_vec()
                }
                Err(_) => Vec::new(),
            },
            Mechanism::Sha256 => match <Hmac<Sha256> as KeyInit>::new_from_slice(key) {
                Ok(mut m) => {
                    m.update(data);
                    m.finalize().into_bytes().to_vec()
                }
                Err(_) => Vec::new(),
            },
        }
    }

    fn hi(self, password: &[u8], salt: &[u8], iterations: u32) -> Vec<u8> {
        let mut out = vec![0u8; self.hash_len()];
        match self {
            Mechanism::Sha1 => pbkdf2::pbkdf2_hmac::<Sha1>(password, salt, iterations, &mut out),
            Mechanism::Sha256 => {
                pbkdf2::pbkdf2_hmac::<Sha256>(password, salt, iterations, &mut out)
            }
        }
        out
    }

    /// The bytes SCRAM's `Hi` takes as the password for `user`.
    pub fn prepare_password(self, user: &str, password: &str) -> Result<Vec<u8>, ScramError> {
        match self {
            Mechanism::Sha1 => Ok(mongo_password_digest(user, password).into_bytes()),
            Mechanism::Sha256 => {
                if password.is_empty() {
                    return Err(ScramError::Unsupported("the password must not be empty"));
                }
                let prepared = stringprep::saslprep(password).map_err(|_| {
                    ScramError::Unsupported(
                        "the password contains characters SASLprep (RFC 4013) prohibits",
                    )
                })?;
                if prepared.is_empty() {
                    return Err(ScramError::Unsupported(
                        "the password is empty after SASLprep",
                    ));
                }
                Ok(prepared.as_bytes().to_vec())
            }
        }
    }
}

/// Most iterations a stored credential may ask for: a login costs two
/// PBKDF2 runs of this length on the client and none on the server, but a
/// damaged or planted value must not make every client spin for minutes.
/// MongoDB's defaults are 10,000 and 15,000.
pub const MAX_ITERATIONS: u32 = 10_000_000;

/// MongoDB's password digest for SCRAM-SHA-1: `hex(md5("<user>:mongo:<password>"))`.
pub fn mongo_password_digest(user: &str, password: &str) -> String {
    let d = md5::Md5::digest(format!("{user}:mongo:{password}").as_bytes());
    d.iter().map(|b| format!("{b:02x}")).collect()
}

/// One mechanism's stored credentials: never the password.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Credentials {
    pub mechanism: Mechanism,
    pub iterations: u32,
    pub salt: Vec<u8>,
    pub stored_key: Vec<u8>,
    pub server_key: Vec<u8>,
}

impl Credentials {
    /// Derive credentials from the prepared password bytes.
    pub fn derive(mechanism: Mechanism, prepared: &[u8], salt: &[u8], iterations: u32) -> Self {
        let salted = mechanism.hi(prepared, salt, iterations);
        let client_key = mechanism.hmac(&salted, b"Client Key");
        Credentials {
            mechanism,
            iterations,
            salt: salt.to_vec(),
            stored_key: mechanism.h(&client_key),
            server_key: mechanism.hmac(&salted, b"Server Key"),
        }
    }

    /// Fresh credentials for `user` with a random salt and the default
    /// iteration count.
    pub fn new(mechanism: Mechanism, user: &str, password: &str) -> Result<Self, ScramError> {
        let prepared = mechanism.prepare_password(user, password)?;
        let mut salt = vec![0u8; mechanism.salt_len()];
        rand::RngCore::fill_bytes(&mut rand::thread_rng(), &mut salt);
        Ok(Credentials::derive(
            mechanism,
            &prepared,
            &salt,
            mechanism.default_iterations(),
        ))
    }

    /// As MongoDB stores them in `credentials.<mechanism>`.
    pub fn to_document(&self) -> Document {
        doc! {
            "iterationCount": i64::from(self.iterations),
            "salt": B64.encode(&self.salt),
            "storedKey": B64.encode(&self.stored_key),
            "serverKey": B64.encode(&self.server_key),
        }
    }

    /// The inverse of [`Credentials::to_document`]; `None` when damaged.
    pub fn from_document(mechanism: Mechanism, d: &Document) -> Option<Self> {
        let iterations = match d.get("iterationCount")? {
            bson::Bson::Int64(n) => u32::try_from(*n).ok()?,
            bson::Bson::Int32(n) => u32::try_from(*n).ok()?,
            _ => return None,
        };
        let b = |k: &str| B64.decode(d.get_str(k).ok()?).ok();
        let c = Credentials {
            mechanism,
            iterations,
            salt: b("salt")?,
            stored_key: b("storedKey")?,
            server_key: b("serverKey")?,
        };
        (iterations > 0
            && iterations <= MAX_ITERATIONS
            && c.stored_key.len() == mechanism.hash_len()
            && c.server_key.len() == mechanism.hash_len())
        .then_some(c)
    }
}

/// The client's first message, parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientFirst {
    /// `n,,` (or `y,,`): echoed base64-encoded in the final message's `c=`.
    pub gs2_header: String,
    /// The message without the GS2 header (part of AuthMessage).
    pub bare: String,
    /// The user name, unescaped (`=2C` → `,`, `=3D` → `=`).
    pub user: String,
    pub nonce: String,
}

fn unescape_name(s: &str) -> Result<String, ScramError> {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find('=') {
        out.push_str(&rest[..i]);
        let tail = &rest[i..];
        if tail.starts_with("=2C") {
            out.push(',');
        } else if tail.starts_with("=3D") {
            out.push('=');
        } else {
            return Err(ScramError::Malformed("bad '=' escape in the user name"));
        }
        rest = &tail[3..];
    }
    out.push_str(rest);
    Ok(out)
}

fn valid_nonce(n: &str) -> bool {
    !n.is_empty() && n.bytes().all(|b| (0x21..0x7f).contains(&b) && b != b',')
}

/// Parse `gs2-header client-first-message-bare`.
pub fn parse_client_first(payload: &[u8]) -> Result<ClientFirst, ScramError> {
    let msg = std::str::from_utf8(payload).map_err(|_| ScramError::Malformed("not UTF-8"))?;
    let (flag, rest) = msg
        .split_once(',')
        .ok_or(ScramError::Malformed("no GS2 header"))?;
    match flag {
        "n" | "y" => {}
        f if f.starts_with("p=") => {
            return Err(ScramError::Unsupported(
                "SCRAM channel binding is not supported",
            ))
        }
        _ => return Err(ScramError::Malformed("bad GS2 channel-binding flag")),
    }
    let (authzid, bare) = rest
        .split_once(',')
        .ok_or(ScramError::Malformed("no GS2 header"))?;
    if !authzid.is_empty() {
        return Err(ScramError::Unsupported(
            "SCRAM authorization identities (a=) are not supported",
        ));
    }
    let mut parts = bare.split(',');
    let user = match parts.next() {
        Some(p) if p.starts_with("m=") => {
            return Err(ScramError::Unsupported(
                "SCRAM extensions are not supported",
            ))
        }
        Some(p) => p
            .strip_prefix("n=")
            .ok_or(ScramError::Malformed("expected n=<user>"))?,
        None => return Err(ScramError::Malformed("expected n=<user>")),
    };
    let nonce = parts
        .next()
        .and_then(|p| p.strip_prefix("r="))
        .ok_or(ScramError::Malformed("expected r=<nonce>"))?;
    if !valid_nonce(nonce) {
        return Err(ScramError::Malformed("bad client nonce"));
    }
    let user = unescape_name(user)?;
    if user.is_empty() {
        return Err(ScramError::Malformed("empty user name"));
    }
    Ok(ClientFirst {
        gs2_header: format!("{flag},,"),
        bare: bare.to_string(),
        user,
        nonce: nonce.to_string(),
    })
}

/// A conversation after the server's first message, waiting for the
/// client's proof.
#[derive(Debug, Clone)]
pub struct Conversation {
    pub mechanism: Mechanism,
    pub user: String,
    client_first: ClientFirst,
    server_first: String,
    nonce: String,
    creds: Credentials,
}

/// A fresh server nonce (24 random bytes, base64).
pub fn server_nonce() -> String {
    let mut b = [0u8; 24];
    rand::RngCore::fill_bytes(&mut rand::thread_rng(), &mut b);
    B64.encode(b)
}

impl Conversation {
    /// Start a conversation: returns it and the server's first message.
    pub fn start(
        client_first: ClientFirst,
        creds: Credentials,
        server_nonce: &str,
    ) -> (Self, String) {
        let nonce = format!("{}{server_nonce}", client_first.nonce);
        let server_first = format!(
            "r={nonce},s={},i={}",
            B64.encode(&creds.salt),
            creds.iterations
        );
        let conv = Conversation {
            mechanism: creds.mechanism,
            user: client_first.user.clone(),
            client_first,
            server_first: server_first.clone(),
            nonce,
            creds,
        };
        (conv, server_first)
    }

    /// Check the client's final message; on success the server's final
    /// message (`v=<ServerSignature>`).
    pub fn finish(&self, payload: &[u8]) -> Result<String, ScramError> {
        let msg = std::str::from_utf8(payload).map_err(|_| ScramError::Malformed("not UTF-8"))?;
        let (without_proof, proof) = msg
            .rsplit_once(",p=")
            .ok_or(ScramError::Malformed("expected p=<proof>"))?;
        let mut parts = without_proof.split(',');
        let cbind = parts
            .next()
            .and_then(|p| p.strip_prefix("c="))
            .ok_or(ScramError::Malformed("expected c=<channel binding>"))?;
        let nonce = parts
            .next()
            .and_then(|p| p.strip_prefix("r="))
            .ok_or(ScramError::Malformed("expected r=<nonce>"))?;
        let cbind = B64
            .decode(cbind)
            .map_err(|_| ScramError::Malformed("c= is not base64"))?;
        let proof = B64
            .decode(proof)
            .map_err(|_| ScramError::Malformed("p= is not base64"))?;
        let m = self.mechanism;
        if cbind != self.client_first.gs2_header.as_bytes()
            || nonce != self.nonce
            || proof.len() != m.hash_len()
        {
            return Err(ScramError::Failed);
        }
        let auth_message = format!(
            "{},{},{without_proof}",
            self.client_first.bare, self.server_first
        );
        let client_sig = m.hmac(&self.creds.stored_key, auth_message.as_bytes());
        let client_key: Vec<u8> = proof.iter().zip(&client_sig).map(|(a, b)| a ^ b).collect();
        let ok: bool = m.h(&client_key).ct_eq(&self.creds.stored_key).into();
        if !ok {
            return Err(ScramError::Failed);
        }
        let server_sig = m.hmac(&self.creds.server_key, auth_message.as_bytes());
        Ok(format!("v={}", B64.encode(server_sig)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Run one RFC-style exchange with the password bytes given as is.
    fn exchange(
        m: Mechanism,
        prepared: &[u8],
        client_first: &str,
        server_first: &str,
        client_final: &str,
    ) -> Result<String, ScramError> {
        let cf = parse_client_first(client_first.as_bytes())?;
        let r = server_first.split(',').next().unwrap_or_default();
        let s = server_first.split(',').nth(1).unwrap_or_default();
        let i: u32 = server_first
            .rsplit_once("i=")
            .and_then(|(_, i)| i.parse().ok())
            .unwrap_or(0);
        let salt = B64.decode(&s[2..]).unwrap_or_default();
        let snonce = &r[2 + cf.nonce.len()..];
        let creds = Credentials::derive(m, prepared, &salt, i);
        let (conv, sf) = Conversation::start(cf, creds, snonce);
        assert_eq!(sf, server_first);
        conv.finish(client_final.as_bytes())
    }

    #[test]
    fn rfc5802_sha1_vector() {
        let out = exchange(
            Mechanism::Sha1,
            b"pencil",
            "n,,n=user,r=fyko+d2lbbFgONRv9qkxdawL",
            "r=fyko+d2lbbFgONRv9qkxdawL3rfcNHYJY1ZVvWVs7j,s=QSXCR+Q6sek8bf92,i=4096",
            "c=biws,r=fyko+d2lbbFgONRv9qkxdawL3rfcNHYJY1ZVvWVs7j,p=v0X8v3Bz2T0CJGbJQyF0X+HI4Ts=",
        );
        assert_eq!(out, Ok("v=rmF9pqV8S7suAoZWja4dJRkFsKQ=".to_string()));
    }

    #[test]
    fn rfc7677_sha256_vector() {
        let out = exchange(
            Mechanism::Sha256,
            b"pencil",
            "n,,n=user,r=rOprNGfwEbeRWgbNEkqO",
            "r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096",
            "c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=",
        );
        assert_eq!(
            out,
            Ok("v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=".to_string())
        );
    }

    #[test]
    fn mongodb_sha1_vector_uses_the_password_digest() {
        assert_eq!(
            mongo_password_digest("user", "pencil"),
            "1c33006ec1ffd90f9cadcbcc0e118200"
        );
        let prepared = Mechanism::Sha1
            .prepare_password("user", "pencil")
            .unwrap_or_default();
        let out = exchange(
            Mechanism::Sha1,
            &prepared,
            "n,,n=user,r=fyko+d2lbbFgONRv9qkxdawL",
            "r=fyko+d2lbbFgONRv9qkxdawLHo+Vgk7qvUOKUwuWLIWg4l/9SraGMHEE,s=rQ9ZY3MntBeuP3E1TDVC4w==,i=10000",
            "c=biws,r=fyko+d2lbbFgONRv9qkxdawLHo+Vgk7qvUOKUwuWLIWg4l/9SraGMHEE,p=MC2T8BvbmWRckDw8oWl5IVghwCY=",
        );
        assert_eq!(out, Ok("v=UMWeI25JD1yNYZRMpZ4VHvhZ9e0=".to_string()));
    }

    #[test]
    fn wrong_proof_fails_without_detail() {
        let out = exchange(
            Mechanism::Sha1,
            b"pencil",
            "n,,n=user,r=fyko+d2lbbFgONRv9qkxdawL",
            "r=fyko+d2lbbFgONRv9qkxdawL3rfcNHYJY1ZVvWVs7j,s=QSXCR+Q6sek8bf92,i=4096",
            "c=biws,r=fyko+d2lbbFgONRv9qkxdawL3rfcNHYJY1ZVvWVs7j,p=AAX8v3Bz2T0CJGbJQyF0X+HI4Ts=",
        );
        assert_eq!(out, Err(ScramError::Failed));
    }

    #[test]
    fn stored_credentials_round_trip() {
        for m in Mechanism::ALL {
            let c = Credentials::new(m, "ann", "secret").unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(
                Credentials::from_document(m, &c.to_document()),
                Some(c.clone())
            );
            let mut d = c.to_document();
            d.insert("iterationCount", i64::from(MAX_ITERATIONS) + 1);
            assert_eq!(Credentials::from_document(m, &d), None);
            d.insert("storedKey", "AAAA");
            assert_eq!(Credentials::from_document(m, &d), None);
        }
    }

    /// Mutated and random client messages never panic, and a mutated final
    /// message never authenticates.
    #[test]
    fn mutated_messages_do_not_panic() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(15);
        let first = b"n,,n=user,r=fyko+d2lbbFgONRv9qkxdawL".to_vec();
        let fin =
            b"c=biws,r=fyko+d2lbbFgONRv9qkxdawL3rfcNHYJY1ZVvWVs7j,p=v0X8v3Bz2T0CJGbJQyF0X+HI4Ts="
                .to_vec();
        let salt = B64.decode("QSXCR+Q6sek8bf92").unwrap_or_default();
        let creds = Credentials::derive(Mechanism::Sha1, b"pencil", &salt, 4096);
        let cf = parse_client_first(&first).unwrap_or_else(|e| panic!("{e}"));
        let (conv, _) = Conversation::start(cf, creds, "3rfcNHYJY1ZVvWVs7j");
        let alphabet = b",=nrcpvsi2C3Dxy\xff\x00aZ+/";
        for _ in 0..5000 {
            for base in [&first, &fin] {
                let mut m = base.clone();
                for _ in 0..rng.gen_range(1..4) {
                    let i = rng.gen_range(0..m.len());
                    match rng.gen_range(0..3) {
                        0 => m[i] = alphabet[rng.gen_range(0..alphabet.len())],
                        1 => {
                            m.remove(i);
                        }
                        _ => m.insert(i, alphabet[rng.gen_range(0..alphabet.len())]),
                    }
                    if m.is_empty() {
                        break;
                    }
                }
                let _ = parse_client_first(&m);
                if m != fin {
                    assert!(
                        conv.finish(&m).is_err(),
                        "{:?}",
                        String::from_utf8_lossy(&m)
                    );
                }
            }
            let random: Vec<u8> = (0..rng.gen_range(0..64)).map(|_| rng.gen()).collect();
            let _ = parse_client_first(&random);
            assert!(conv.finish(&random).is_err());
        }
        assert!(conv.finish(&fin).is_ok());
    }

    #[test]
    fn malformed_messages_are_errors() {
        for bad in [
            &b""[..],
            b"n",
            b"n,,",
            b"x,,n=u,r=abc",
            b"n,,n=u",
            b"n,,n=u=ZZ,r=abc",
            b"n,,n=,r=abc",
            b"\xff\xfe",
        ] {
            assert!(parse_client_first(bad).is_err(), "{bad:?}");
        }
        assert!(matches!(
            parse_client_first(b"p=tls-unique,,n=u,r=abc"),
            Err(ScramError::Unsupported(_))
        ));
        let cf = parse_client_first(b"n,,n=a=2Cb=3Dc,r=abc").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(cf.user, "a,b=c");
        let prep = |p: &str| Mechanism::Sha256.prepare_password("u", p);
        assert_eq!(prep("I\u{AD}X"), Ok(b"IX".to_vec()));
        assert_eq!(prep("p\u{A0}w"), Ok(b"p w".to_vec()));
        assert_eq!(prep("pässword"), Ok("pässword".as_bytes().to_vec()));
        assert!(prep("a\u{7}b").is_err());
        assert!(prep("\u{AD}").is_err());
    }
}
