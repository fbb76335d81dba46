//! Who may use the server: a bearer token, or a user and password (answered on the Flight
//! `Handshake` with a bearer token for the calls that follow, or checked as HTTP Basic on every
//! call). Checked by a tonic interceptor before any call reaches the service.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use base64::Engine as _;
use base64::alphabet;
use base64::engine::general_purpose::STANDARD as BASE64;
use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
use tonic::{Request, Status};

use super::ServerStats;

/// Who may use the server.
#[derive(Clone, Debug, Default, PartialEq)]
pub enum Credentials {
    /// Anyone who can reach the socket.
    #[default]
    None,
    /// Clients send `authorization: Bearer <token>`.
    Token(String),
    /// Clients authenticate with HTTP Basic credentials (on the Flight `Handshake`, which answers
    /// with a bearer token for the following calls, or on every call).
    Password { user: String, password: String },
}

pub(super) fn random_token() -> String {
    let bytes: [u8; 24] = rand::random();
    BASE64.encode(bytes)
}

pub(super) struct Authenticator {
    pub(super) credentials: Credentials,
    /// The bearer token that is accepted (none when the server is open).
    pub(super) token: Option<String>,
    pub(super) stats: Arc<ServerStats>,
}

impl Authenticator {
    /// Lets a request through when the server is open, or when it carries the bearer token, or
    /// (with user and password configured) valid Basic credentials.
    pub(super) fn check(&self, request: Request<()>) -> std::result::Result<Request<()>, Status> {
        let Some(token) = &self.token else { return Ok(request) };
        let header = request.metadata().get("authorization").and_then(|v| v.to_str().ok());
        let accepted = match header {
            Some(value) => match value.split_once(' ') {
                Some((scheme, presented)) if scheme.eq_ignore_ascii_case("bearer") => {
                    constant_time_eq(presented.as_bytes(), token.as_bytes())
                }
                Some((scheme, presented)) if scheme.eq_ignore_ascii_case("basic") => self.basic_is_valid(presented),
                _ => false,
            },
            None => false,
        };
        if accepted {
            Ok(request)
        } else {
            self.stats.refused_requests.fetch_add(1, Ordering::SeqCst);
            let reason = if header.is_none() { "no credentials given" } else { "invalid credentials" };
            Err(Status::unauthenticated(format!("simjoin server: {reason}")))
        }
    }

    fn basic_is_valid(&self, encoded: &str) -> bool {
        let Credentials::Password { user, password } = &self.credentials else { return false };
        // Go's Flight client (ADBC) sends the credentials unpadded; Rust's and Java's padded.
        let lenient = GeneralPurpose::new(
            &alphabet::STANDARD,
            GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
        );
        let Ok(decoded) = lenient.decode(encoded.trim()) else { return false };
        let Some((given_user, given_password)) = std::str::from_utf8(&decoded).ok().and_then(|s| s.split_once(':'))
        else {
            return false;
        };
        // Both compared in full, so the time taken does not tell which one was wrong.
        constant_time_eq(given_user.as_bytes(), user.as_bytes())
            & constant_time_eq(given_password.as_bytes(), password.as_bytes())
    }
}

/// Equality whose time depends on the lengths only, not on where the first difference is.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use base64::Engine;
    use base64::engine::general_purpose::STANDARD as BASE64;
    use tonic::Request;

    use super::{Authenticator, Credentials};

    fn authenticator(credentials: Credentials, token: Option<&str>) -> Authenticator {
        Authenticator { credentials, token: token.map(str::to_string), stats: Arc::default() }
    }

    fn request(authorization: Option<&str>) -> Request<()> {
        let mut request = Request::new(());
        if let Some(value) = authorization {
            request.metadata_mut().insert("authorization", value.parse().unwrap());
        }
        request
    }

    #[test]
    fn an_open_server_lets_everyone_in() {
        let open = authenticator(Credentials::None, None);
        assert!(open.check(request(None)).is_ok());
        assert!(open.check(request(Some("Bearer anything"))).is_ok());
    }

    #[test]
    fn tokens_and_passwords_are_checked() {
        let token = authenticator(Credentials::Token("s3cret".into()), Some("s3cret"));
        assert!(token.check(request(Some("Bearer s3cret"))).is_ok());
        assert!(token.check(request(Some("bearer s3cret"))).is_ok());
        for refused in [None, Some("Bearer s3cre"), Some("Bearer s3cret!"), Some("s3cret"), Some("Basic czNjcmV0")] {
            let status = token.check(request(refused)).unwrap_err();
            assert_eq!(status.code(), tonic::Code::Unauthenticated, "{refused:?}");
        }
        assert_eq!(token.stats.refused_requests(), 5);

        let password =
            authenticator(Credentials::Password { user: "ann".into(), password: "pw:1".into() }, Some("tok"));
        let basic = |s: &str| format!("Basic {}", BASE64.encode(s));
        assert!(password.check(request(Some(&basic("ann:pw:1")))).is_ok());
        assert!(
            password.check(request(Some(basic("ann:pw:1").trim_end_matches('=')))).is_ok(),
            "unpadded, as Go sends it"
        );
        assert!(password.check(request(Some("Bearer tok"))).is_ok());
        for refused in [basic("ann:pw"), basic("bob:pw:1"), basic("annpw:1"), "Basic !!!".to_string()] {
            assert!(password.check(request(Some(&refused))).is_err(), "{refused}");
        }
    }
}
