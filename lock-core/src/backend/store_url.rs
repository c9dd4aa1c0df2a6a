//! One parser for every store URL, so credentials are decoded, kept and hidden the same
//! way on every backend.
//!
//! Built on the `url` crate for the hard parts (percent-decoding, host and port syntax,
//! query pairs); what it adds is what store URLs need and web URLs do not: a list of hosts
//! (`h1:1,h2:2` for Redlock, etcd and ZooKeeper), a file path form for embedded stores,
//! and errors that never repeat the credentials part of the input.

use std::fmt;
use std::num::NonZeroU64;
use std::time::Duration;

use crate::values::error::{Error, ErrorKind, Result};

/// Query parameters whose values are secrets (or can carry one, like PostgreSQL's
/// `options=-c ...`), hidden wherever a URL is shown.
const SECRET_PARAMS: &[&str] = &["password", "sslpassword", "options", "token", "secret"];

/// A parsed store URL: `scheme://[user[:password]@]host[:port][,host[:port]...][/path][?query]`.
///
/// User name and password are percent-decoded; a reserved character (`/ ? # @ : %`) in
/// them must be percent-encoded in the URL. `Debug` and [`redacted`](Self::redacted) show
/// the password and secret query values as `***`.
///
/// ```
/// use lock_core::backend::StoreUrl;
///
/// let url = StoreUrl::parse("redis+redlock://app:p%2Fss@h1:7001,h2:7002/3?node_timeout_ms=50")?;
/// assert_eq!(url.scheme(), "redis+redlock");
/// assert_eq!(url.password(), Some("p/ss"));
/// assert_eq!(url.hosts().len(), 2);
/// assert_eq!(url.path(), "3");
/// assert_eq!(url.redacted(), "redis+redlock://app:***@h1:7001,h2:7002/3?node_timeout_ms=50");
/// # Ok::<(), lock_core::Error>(())
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct StoreUrl {
    scheme: String,
    username: String,
    password: Option<String>,
    hosts: Vec<StoreHost>,
    path: String,
    query: Vec<(String, String)>,
    /// Names of the query pairs that followed a secret parameter: an unencoded `&` in a
    /// secret value splits it, and its tail then reads as further pairs, so they are
    /// never shown.
    after_secret: Vec<String>,
}

/// One `host[:port]` of a store URL.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoreHost {
    /// The host name or address; IPv6 addresses keep their brackets (`[::1]`).
    pub host: String,
    /// The port, when the URL gave one.
    pub port: Option<u16>,
}

impl StoreHost {
    /// `host:port`, with `default_port` when the URL gave none.
    pub fn with_port(&self, default_port: u16) -> String {
        format!("{}:{}", self.host, self.port.unwrap_or(default_port))
    }
}

impl StoreUrl {
    /// Parses a URL with an authority (user, password, one or more hosts).
    pub fn parse(input: &str) -> Result<Self> {
        let (scheme, rest) = split_scheme(input)?;
        let shown = redact_url(input);
        let invalid = |why: &str| invalid_url(&shown, why);
        let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
        // An '@' past the authority means a password with an unencoded reserved character:
        // refuse it rather than guess where the password ends.
        if rest[authority_end..].contains('@') {
            return Err(invalid(
                "'@' after the host part; percent-encode reserved characters \
                 (/ ? # @ : %) in the user name and password",
            ));
        }
        let (authority, tail) = rest.split_at(authority_end);
        let (userinfo, host_list) = match authority.rfind('@') {
            Some(at) => (&authority[..at], &authority[at + 1..]),
            None => ("", authority),
        };
        if userinfo.contains('@') {
            return Err(invalid(
                "'@' in the user name or password; percent-encode it as %40",
            ));
        }
        if host_list.is_empty() {
            return Err(invalid("no host"));
        }
        let mut hosts = Vec::new();
        for host in host_list.split(',') {
            hosts.push(parse_host(host.trim()).map_err(|why| invalid(&why))?);
        }
        // The `url` crate decodes the credentials, path and query; the host list is
        // replaced by one placeholder it can parse.
        let at = if userinfo.is_empty() { "" } else { "@" };
        let parsed = url::Url::parse(&format!("distlock://{userinfo}{at}placeholder{tail}"))
            .map_err(|err| invalid(&format!("{err}")))?;
        let username = decode(parsed.username(), "user name").map_err(|why| invalid(&why))?;
        let password = parsed
            .password()
            .map(|p| decode(p, "password"))
            .transpose()
            .map_err(|why| invalid(&why))?;
        let path =
            decode(parsed.path().trim_start_matches('/'), "path").map_err(|why| invalid(&why))?;
        Ok(StoreUrl {
            scheme,
            username,
            password,
            hosts,
            path,
            ..Self::with_query(parsed.query_pairs().into_owned().collect())
        })
    }

    /// Parses `input` as a file URL ([`parse_file`](Self::parse_file)) when its scheme is
    /// one of `file_schemes`, else as a URL with hosts ([`parse`](Self::parse)): for a
    /// backend that serves embedded and networked stores alike.
    pub fn parse_either(input: &str, file_schemes: &[&str]) -> Result<Self> {
        let (scheme, _) = split_scheme(input)?;
        if file_schemes.contains(&scheme.as_str()) {
            Self::parse_file(input)
        } else {
            Self::parse(input)
        }
    }

    /// Parses a URL whose whole body is a file path, for embedded stores:
    /// `sqlite:///abs/path.db` or `sqlite://relative.db`, with an optional `?query`.
    pub fn parse_file(input: &str) -> Result<Self> {
        let (scheme, rest) = split_scheme(input)?;
        let (path, query) = rest.split_once('?').unwrap_or((rest, ""));
        let shown = redact_url(input);
        let path = decode(path, "path").map_err(|why| invalid_url(&shown, &why))?;
        let query = url::form_urlencoded::parse(query.as_bytes())
            .into_owned()
            .collect();
        Ok(StoreUrl {
            scheme,
            username: String::new(),
            password: None,
            hosts: Vec::new(),
            path,
            ..Self::with_query(query)
        })
    }

    /// An otherwise empty URL with these query pairs, noting which follow a secret.
    fn with_query(query: Vec<(String, String)>) -> Self {
        let after_secret = query
            .iter()
            .skip_while(|(name, _)| !is_secret(name))
            .skip(1)
            .map(|(name, _)| name.clone())
            .collect();
        StoreUrl {
            scheme: String::new(),
            username: String::new(),
            password: None,
            hosts: Vec::new(),
            path: String::new(),
            query,
            after_secret,
        }
    }

    /// Whether a query pair may be shown: not a secret, and not after one (see
    /// `after_secret`).
    fn shows_param(&self, name: &str) -> bool {
        !is_secret(name) && !self.after_secret.iter().any(|hidden| hidden == name)
    }

    /// The [`ErrorKind::InvalidInput`] error for an option the store does not know, in one
    /// wording for every store; the name is not shown when it followed a secret parameter
    /// (it may be the tail of a secret value with an unencoded `&`).
    pub fn unknown_option(&self, name: &str) -> Error {
        if self.shows_param(name) || is_secret(name) {
            self.error(&format!("unknown option {name:?}"))
        } else {
            self.error(
                "unknown option after a secret parameter (not shown: percent-encode '&' \
                 in secret values as %26)",
            )
        }
    }

    /// Refuses whatever query parameters were not taken, in one wording for every store:
    /// call it once every known option has been taken (`take_*`).
    pub fn finish(&self) -> Result<()> {
        match self.query.first() {
            Some((name, _)) => Err(self.unknown_option(name)),
            None => Ok(()),
        }
    }

    /// The scheme, in lower case.
    pub fn scheme(&self) -> &str {
        &self.scheme
    }

    /// The decoded user name; empty when the URL gave none.
    pub fn username(&self) -> &str {
        &self.username
    }

    /// The decoded password, if any. Never log it.
    pub fn password(&self) -> Option<&str> {
        self.password.as_deref()
    }

    /// The hosts, in the order given (empty for a file URL).
    pub fn hosts(&self) -> &[StoreHost] {
        &self.hosts
    }

    /// The decoded path without its leading `/` (a database name or number), or the file
    /// path of a file URL.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// The decoded query pairs, in order.
    pub fn query(&self) -> &[(String, String)] {
        &self.query
    }

    /// Removes and returns the value of the query parameter `name` (the last one if it
    /// is repeated), so what is left over can be refused or passed on.
    pub fn take_param(&mut self, name: &str) -> Option<String> {
        let mut value = None;
        self.query.retain(|(key, v)| {
            if key == name {
                value = Some(v.clone());
                false
            } else {
                true
            }
        });
        value
    }

    /// Like [`take_param`](Self::take_param), parsed: a value that does not parse is
    /// [`ErrorKind::InvalidInput`] saying `name="value" is not {expected}` (the value is
    /// not repeated when the parameter is a secret), the one wording of every option.
    pub fn take_parsed<T: std::str::FromStr>(
        &mut self,
        name: &str,
        expected: &str,
    ) -> Result<Option<T>> {
        self.take_read(name, expected, |value| value.parse().ok())
    }

    /// Takes the option `name` as a positive number of milliseconds (the `..._ms` options
    /// of every store); `0` is refused, since no bound or TTL can be zero.
    pub fn take_millis(&mut self, name: &str) -> Result<Option<Duration>> {
        let ms = self.take_parsed::<NonZeroU64>(name, "a positive number of milliseconds")?;
        Ok(ms.map(|ms| Duration::from_millis(ms.get())))
    }

    /// Takes the option `name` as a yes or no: `true`, `yes`, `1` or `false`, `no`, `0`, in
    /// any case.
    pub fn take_flag(&mut self, name: &str) -> Result<Option<bool>> {
        self.take_read(name, "true or false", |value| {
            match value.to_ascii_lowercase().as_str() {
                "true" | "yes" | "1" => Some(true),
                "false" | "no" | "0" => Some(false),
                _ => None,
            }
        })
    }

    /// Takes the option `name` as one of `choices` (`(spelling, value)` pairs, spellings
    /// compared in any case); any other value is refused naming the spellings.
    pub fn take_choice<T: Copy>(&mut self, name: &str, choices: &[(&str, T)]) -> Result<Option<T>> {
        let spellings: Vec<&str> = choices.iter().map(|(spelling, _)| *spelling).collect();
        self.take_read(name, &one_of(&spellings), |value| {
            choices
                .iter()
                .find(|(spelling, _)| spelling.eq_ignore_ascii_case(value))
                .map(|(_, choice)| *choice)
        })
    }

    /// The scheme, when it is one of `schemes` (listed in lower case); any other is
    /// [`ErrorKind::InvalidInput`] naming those accepted. Returns the matching entry of
    /// `schemes`, so a backend can `match` on it.
    pub fn expect_scheme(&self, schemes: &[&'static str]) -> Result<&'static str> {
        schemes
            .iter()
            .copied()
            .find(|scheme| *scheme == self.scheme)
            .ok_or_else(|| {
                self.error(&format!(
                    "unsupported scheme {:?} (expected {})",
                    self.scheme,
                    one_of(schemes)
                ))
            })
    }

    /// Takes the option `name` and reads it with `read`; a value it does not accept is
    /// refused in the one wording of every option.
    fn take_read<T>(
        &mut self,
        name: &str,
        expected: &str,
        read: impl FnOnce(&str) -> Option<T>,
    ) -> Result<Option<T>> {
        let Some(value) = self.take_param(name) else {
            return Ok(None);
        };
        match read(&value) {
            Some(read) => Ok(Some(read)),
            None => {
                let shown = if self.shows_param(name) {
                    value.as_str()
                } else {
                    "***"
                };
                Err(self.error(&format!("{name}={shown:?} is not {expected}")))
            }
        }
    }

    /// An [`ErrorKind::InvalidInput`] error about this URL, showing it redacted.
    pub fn error(&self, why: &str) -> Error {
        invalid_url(&self.redacted(), why)
    }

    /// The URL as it may be shown: password and secret query values replaced by `***`.
    pub fn redacted(&self) -> String {
        let mut shown = format!("{}://", self.scheme);
        if !self.username.is_empty() || self.password.is_some() {
            shown.push_str(&encode(&self.username));
            if self.password.is_some() {
                shown.push_str(":***");
            }
            shown.push('@');
        }
        let hosts: Vec<String> = self
            .hosts
            .iter()
            .map(|h| match h.port {
                Some(port) => format!("{}:{port}", h.host),
                None => h.host.clone(),
            })
            .collect();
        shown.push_str(&hosts.join(","));
        if !self.path.is_empty() {
            if !self.hosts.is_empty() {
                shown.push('/');
            }
            shown.push_str(&self.path);
        }
        let query: Vec<String> = self
            .query
            .iter()
            .map(|(k, v)| {
                if is_secret(k) {
                    format!("{}=***", encode(k))
                } else if self.shows_param(k) {
                    format!("{}={}", encode(k), encode(v))
                } else {
                    "***".to_string()
                }
            })
            .collect();
        if !query.is_empty() {
            shown.push('?');
            shown.push_str(&query.join("&"));
        }
        shown
    }
}

impl fmt::Debug for StoreUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("StoreUrl").field(&self.redacted()).finish()
    }
}

impl fmt::Display for StoreUrl {
    /// The redacted form; the password is never shown.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.redacted())
    }
}

/// `url` with its credentials part and secret query values replaced by `***`, for any
/// message or log line that must show a store address, even one that does not parse.
///
/// Whatever lies between `://` and the last `@` of the input is treated as credentials,
/// so a password with an unencoded `/`, `?`, `#` or `@` is hidden too.
pub fn redact_url(url: &str) -> String {
    // Nothing after a secret query parameter's name is shown: its value may hold any
    // character, an unencoded '&' or '@' included.
    let url = match secret_value_start(url) {
        Some(at) => &url[..at],
        None => url,
    };
    let Some(scheme_end) = url.find("://").map(|i| i + 3) else {
        // Not a URL: it may still be a mistyped one with a password in it.
        return match url.rfind('@') {
            Some(_) => "<unparsable URL hidden: it may contain credentials>".to_string(),
            None => url.to_string(),
        };
    };
    let (head, rest) = url.split_at(scheme_end);
    let rest = match rest.rfind('@') {
        Some(at) => {
            let user = rest[..at].split([':', '/', '?', '#']).next().unwrap_or("");
            format!("{user}:***{}", &rest[at..])
        }
        None => rest.to_string(),
    };
    let (before_query, query) = match rest.split_once('?') {
        Some((before, query)) => (before, Some(query)),
        None => (rest.as_str(), None),
    };
    let mut shown = format!("{head}{before_query}");
    if let Some(query) = query {
        // The input was cut at the first secret value, so a secret is the last pair.
        let pairs: Vec<String> = query
            .split('&')
            .map(|pair| {
                let name = pair.split_once('=').map_or(pair, |(name, _)| name);
                if is_secret(name) {
                    format!("{name}=***")
                } else {
                    pair.to_string()
                }
            })
            .collect();
        shown.push('?');
        shown.push_str(&pairs.join("&"));
    }
    shown
}

/// `text` (a store client's message, say) with the credentials of the store URL `url`
/// hidden wherever they show: the URL itself, and each secret (the password, secret query
/// values) where it stands as one (`:pw@`, `=pw`). A secret's bare text is replaced only
/// when it is long enough not to be an ordinary word: with the password `p`, "pool timed
/// out" must stay readable.
pub fn redact_url_in(text: &str, url: &str) -> String {
    let mut text = text.replace(url, &redact_url(url));
    let secrets: Vec<String> = match StoreUrl::parse(url) {
        Ok(parsed) => parsed
            .password()
            .map(str::to_owned)
            .into_iter()
            .chain(
                parsed
                    .query()
                    .iter()
                    .filter(|(name, _)| is_secret(name))
                    .map(|(_, value)| value.clone()),
            )
            .filter(|secret| !secret.is_empty())
            .collect(),
        Err(_) => Vec::new(),
    };
    const UNMISTAKABLE: usize = 8;
    for secret in secrets {
        text = text
            .replace(&format!(":{secret}@"), ":***@")
            .replace(&format!("={secret}"), "=***");
        if secret.chars().count() >= UNMISTAKABLE {
            text = text.replace(&secret, "***");
        }
    }
    text
}

/// Where the value of the first secret query parameter begins (at its `=`), if any.
fn secret_value_start(url: &str) -> Option<usize> {
    let query = url.find('?')? + 1;
    let mut start = query;
    for pair in url[query..].split('&') {
        if let Some((name, _)) = pair.split_once('=') {
            if is_secret(name) {
                return Some(start + name.len());
            }
        }
        start += pair.len() + 1;
    }
    None
}

/// `"a"` alone, or `one of "a", "b"`.
fn one_of(choices: &[&str]) -> String {
    let quoted: Vec<String> = choices.iter().map(|choice| format!("{choice:?}")).collect();
    match quoted.as_slice() {
        [one] => one.clone(),
        _ => format!("one of {}", quoted.join(", ")),
    }
}

fn is_secret(name: &str) -> bool {
    SECRET_PARAMS.iter().any(|s| s.eq_ignore_ascii_case(name))
}

fn split_scheme(input: &str) -> Result<(String, &str)> {
    let Some((scheme, rest)) = input.split_once("://") else {
        return Err(invalid_url(
            &redact_url(input),
            "not a store URL (expected scheme://...)",
        ));
    };
    let valid = scheme
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic())
        && scheme
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'));
    if !valid {
        return Err(invalid_url(&redact_url(input), "the scheme is not valid"));
    }
    Ok((scheme.to_ascii_lowercase(), rest))
}

fn parse_host(host: &str) -> std::result::Result<StoreHost, String> {
    if host.is_empty() {
        return Err("a host is missing".into());
    }
    let (name, port) = if let Some(inner) = host.strip_prefix('[') {
        let close = inner.find(']').ok_or("an IPv6 address lacks its ']'")?;
        let after = &inner[close + 1..];
        let port = match after.strip_prefix(':') {
            Some(port) => Some(port),
            None if after.is_empty() => None,
            None => return Err(format!("unexpected {after:?} after an IPv6 address")),
        };
        (&host[..close + 2], port)
    } else {
        match host.rsplit_once(':') {
            Some((name, port)) => (name, Some(port)),
            None => (host, None),
        }
    };
    let port = port
        .map(|p| {
            p.parse::<u16>()
                .map_err(|_| format!("port {p:?} is not a number from 0 to 65535"))
        })
        .transpose()?;
    // Let the `url` crate judge the host syntax (IPv4, IPv6, domain).
    url::Url::parse(&format!("http://{name}/"))
        .ok()
        .filter(|u| u.host_str().is_some())
        .ok_or_else(|| format!("{name:?} is not a valid host"))?;
    Ok(StoreHost {
        host: name.to_string(),
        port,
    })
}

fn decode(raw: &str, what: &str) -> std::result::Result<String, String> {
    percent_encoding::percent_decode_str(raw)
        .decode_utf8()
        .map(|text| text.into_owned())
        .map_err(|_| format!("the {what} is not valid UTF-8 after percent-decoding"))
}

/// Characters kept as they are when a decoded part is shown again (RFC 3986 unreserved).
const SHOWN_AS_IS: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

fn encode(text: &str) -> String {
    percent_encoding::utf8_percent_encode(text, SHOWN_AS_IS).to_string()
}

fn invalid_url(shown: &str, why: &str) -> Error {
    Error::new(ErrorKind::InvalidInput, format!("store URL {shown}: {why}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_hosts_credentials_path_and_query() {
        let url = StoreUrl::parse("REDIS://u%40x:p%3Fw@[::1]:7000,h2/5?a=1&b=x%20y").unwrap();
        assert_eq!(url.scheme(), "redis");
        assert_eq!(url.username(), "u@x");
        assert_eq!(url.password(), Some("p?w"));
        assert_eq!(
            url.hosts(),
            &[
                StoreHost {
                    host: "[::1]".into(),
                    port: Some(7000)
                },
                StoreHost {
                    host: "h2".into(),
                    port: None
                },
            ]
        );
        assert_eq!(url.hosts()[1].with_port(6379), "h2:6379");
        assert_eq!(url.path(), "5");
        assert_eq!(url.query()[1], ("b".to_string(), "x y".to_string()));
        let file = StoreUrl::parse_file("sqlite:///tmp/a%20b.db?table=t").unwrap();
        assert_eq!(file.path(), "/tmp/a b.db");
        assert_eq!(file.query(), &[("table".to_string(), "t".to_string())]);
    }

    #[test]
    fn take_param_leaves_the_rest() {
        let mut url =
            StoreUrl::parse("postgres://h/db?pool_size=3&sslmode=disable&pool_size=4").unwrap();
        assert_eq!(
            url.take_parsed::<u32>("pool_size", "a number").unwrap(),
            Some(4)
        );
        assert_eq!(
            url.query(),
            &[("sslmode".to_string(), "disable".to_string())]
        );
        let mut url = StoreUrl::parse("postgres://h/db?password=hunter2").unwrap();
        let err = url.take_parsed::<u32>("password", "a number").unwrap_err();
        assert!(!err.to_string().contains("hunter2"), "{err}");
    }

    #[test]
    fn options_are_taken_typed_and_refused_in_one_wording() {
        let mut url =
            StoreUrl::parse("etcd://h/p?wait_ms=250&durable=YES&fast=0&layout=Etcd-Mutex&left=1")
                .unwrap();
        assert_eq!(url.expect_scheme(&["redis", "etcd"]).unwrap(), "etcd");
        assert_eq!(
            url.take_millis("wait_ms").unwrap(),
            Some(Duration::from_millis(250))
        );
        assert_eq!(url.take_millis("wait_ms").unwrap(), None, "taken once");
        assert_eq!(url.take_flag("durable").unwrap(), Some(true));
        assert_eq!(url.take_flag("fast").unwrap(), Some(false));
        assert_eq!(url.take_flag("absent").unwrap(), None);
        let layouts = [("distlock", 1), ("etcd-mutex", 2)];
        assert_eq!(url.take_choice("layout", &layouts).unwrap(), Some(2));
        assert_eq!(url.take_choice("absent", &layouts).unwrap(), None);
        let err = url.finish().unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidInput);
        assert!(err.message().ends_with("unknown option \"left\""), "{err}");
        url.take_param("left");
        url.finish().unwrap();

        let refused = |query: &str, take: &dyn Fn(&mut StoreUrl) -> Result<()>| {
            let mut url = StoreUrl::parse(&format!("etcd://u:pw@h?{query}")).unwrap();
            let err = take(&mut url).unwrap_err();
            assert_eq!(err.kind(), ErrorKind::InvalidInput, "{query}");
            assert!(!err.message().contains("pw@"), "{err}");
            err.message().rsplit_once(": ").unwrap().1.to_string()
        };
        let millis = |url: &mut StoreUrl| url.take_millis("t_ms").map(drop);
        assert_eq!(
            refused("t_ms=0", &millis),
            "t_ms=\"0\" is not a positive number of milliseconds"
        );
        assert_eq!(
            refused("t_ms=-5", &millis),
            "t_ms=\"-5\" is not a positive number of milliseconds"
        );
        assert_eq!(
            refused("on=maybe", &|url| url.take_flag("on").map(drop)),
            "on=\"maybe\" is not true or false"
        );
        assert_eq!(
            refused("layout=zk", &|url| url
                .take_choice("layout", &layouts)
                .map(drop)),
            "layout=\"zk\" is not one of \"distlock\", \"etcd-mutex\""
        );
        assert_eq!(
            refused("", &|url| url.expect_scheme(&["redis", "rediss"]).map(drop)),
            "unsupported scheme \"etcd\" (expected one of \"redis\", \"rediss\")"
        );
        assert_eq!(
            refused("", &|url| url.expect_scheme(&["zk"]).map(drop)),
            "unsupported scheme \"etcd\" (expected \"zk\")"
        );
        // A secret's value is never repeated, even when it is a bad value.
        assert_eq!(
            refused("password=hunter2", &|url| url
                .take_flag("password")
                .map(drop)),
            "password=\"***\" is not true or false"
        );
    }

    #[test]
    fn parse_either_reads_file_schemes_as_paths() {
        let file = StoreUrl::parse_either("SQLITE://rel/a.db?table=t", &["sqlite"]).unwrap();
        assert_eq!((file.scheme(), file.path()), ("sqlite", "rel/a.db"));
        assert!(file.hosts().is_empty());
        let server = StoreUrl::parse_either("postgres://u@h:5/db", &["sqlite"]).unwrap();
        assert_eq!((server.hosts().len(), server.path()), (1, "db"));
        assert!(StoreUrl::parse_either("postgres:///db", &["sqlite"]).is_err());
    }

    #[test]
    fn a_short_secret_is_hidden_only_where_it_stands_as_one() {
        let store = "postgres://app:p@127.0.0.1:5432/db";
        let line = "pool timed out while waiting for an open connection";
        assert_eq!(redact_url_in(line, store), line);
        let repeated = format!("cannot reach {store}; tried app:p@127.0.0.1 with password=p");
        let hidden = redact_url_in(&repeated, store);
        assert!(
            !hidden.contains(":p@") && !hidden.contains("=p"),
            "{hidden}"
        );
        assert!(
            hidden.contains("postgres://app:***@127.0.0.1:5432/db"),
            "{hidden}"
        );
    }

    #[test]
    fn a_long_secret_is_hidden_wherever_it_shows() {
        let store = "redis://:correct-horse-battery@127.0.0.1:6379";
        let hidden = redact_url_in("AUTH correct-horse-battery refused", store);
        assert_eq!(hidden, "AUTH *** refused");
        let store = "postgres://u@h/db?sslmode=x&password=tr0ub4dor-and-3";
        let hidden = redact_url_in("auth with tr0ub4dor-and-3 failed", store);
        assert_eq!(hidden, "auth with *** failed");
    }

    #[test]
    fn bad_urls_are_invalid_input() {
        for bad in [
            "no scheme",
            "://h",
            "redis://",
            "redis://h:99999",
            "redis://h,,h2",
            "redis://[::1",
            "redis://h:1:2x",
        ] {
            let err = StoreUrl::parse(bad).unwrap_err();
            assert_eq!(err.kind(), ErrorKind::InvalidInput, "{bad}");
        }
    }

    #[test]
    fn redaction_hides_passwords_and_secret_params() {
        assert_eq!(redact_url("redis://u:s3cret@h:1/0"), "redis://u:***@h:1/0");
        assert_eq!(redact_url("redis://:pa/ss@h:6379"), "redis://:***@h:6379");
        assert_eq!(
            redact_url("postgres://u:p#ss@h/db"),
            "postgres://u:***@h/db"
        );
        assert_eq!(
            redact_url("postgres://u@h/db?sslmode=x&password=hunter2"),
            "postgres://u:***@h/db?sslmode=x&password=***"
        );
        assert_eq!(redact_url("sqlite:///tmp/a.db"), "sqlite:///tmp/a.db");
        // An unencoded '&' in a secret value: its tail is hidden too.
        assert_eq!(
            redact_url("postgres://u@h/db?password=abc&tail=xyz"),
            "postgres://u:***@h/db?password=***"
        );
        assert_eq!(redact_url("not a url"), "not a url");
        assert!(!redact_url("u:pw@h").contains("pw"));
    }

    /// Generates passwords from the characters most likely to confuse a URL parser and
    /// checks that none ever shows in an error, its source chain, `Debug` or `Display`.
    #[test]
    fn generated_passwords_never_show() {
        const ALPHABET: &[char] = &[
            'a', 'Z', '9', '/', '?', '#', '@', ':', '%', '&', '=', '+', ' ', '[', ']', ',', 'é',
            '!',
        ];
        let mut rng = fastrand::Rng::with_seed(0x5eed);
        for _ in 0..5000 {
            let len = rng.usize(6..16);
            // A fixed marker so the search cannot match by accident on a short password.
            let mut password = String::from("Zq7");
            for _ in 0..len {
                password.push(ALPHABET[rng.usize(..ALPHABET.len())]);
            }
            let encoded = encode(&password);
            for input in [
                format!("redis://user:{password}@h:6379/0"),
                format!("redis+redlock://user:{password}@h1:1,h2:2"),
                format!("postgres://user@h/db?password={password}"),
                format!("postgres://user@h/db?password={password}&sslmode=require"),
                format!("mysql://user:{encoded}@h/db"),
                format!("x://user:{password}@"),
            ] {
                let shown = match StoreUrl::parse(&input) {
                    Ok(url) => {
                        if input.contains(&encoded) && input.starts_with("mysql") {
                            assert_eq!(url.password(), Some(password.as_str()), "{input}");
                        }
                        // How a backend refuses what it does not know.
                        let mut rest = url.clone();
                        rest.take_param("password");
                        rest.take_param("sslmode");
                        let refused = rest.finish().err().map(|e| e.to_string());
                        format!("{url:?} {url} {refused:?}")
                    }
                    Err(err) => {
                        let mut text = format!("{err} {err:?}");
                        let mut source = std::error::Error::source(&err);
                        while let Some(s) = source {
                            text.push_str(&s.to_string());
                            source = s.source();
                        }
                        text
                    }
                };
                assert!(!shown.contains(&password), "{password:?} shown in {shown}");
                // Nor the tail that an unencoded '&' splits off a secret value.
                if let Some((_, tail)) = password.split_once('&') {
                    if tail.len() >= 4 {
                        assert!(!shown.contains(tail), "tail {tail:?} shown in {shown}");
                        assert!(!redact_url(&input).contains(tail), "{input}");
                    }
                }
                assert!(!redact_url(&input).contains(&password), "{input}");
            }
        }
    }
}
