//! Keeping credentials out of logs, errors and Debug output.

/// `url` with any password replaced by `***` (`redis://user:***@host:6379/0`), for every
/// message or log line that shows a store address.
pub fn redact_url(url: &str) -> String {
    let Some(scheme_end) = url.find("://").map(|i| i + 3) else {
        return url.to_string();
    };
    let rest = &url[scheme_end..];
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let authority = &rest[..authority_end];
    let Some(at) = authority.rfind('@') else {
        return url.to_string();
    };
    let userinfo = &authority[..at];
    let user = userinfo.split(':').next().unwrap_or("");
    let shown = if userinfo.contains(':') {
        format!("{user}:***")
    } else {
        user.to_string()
    };
    format!("{}{shown}{}", &url[..scheme_end], &rest[at..])
}

#[cfg(test)]
mod tests {
    use super::redact_url;

    #[test]
    fn hides_passwords_only() {
        assert_eq!(redact_url("redis://u:s3cret@h:1/0"), "redis://u:***@h:1/0");
        assert_eq!(
            redact_url("postgres://:p@w@h/db?x=1"),
            "postgres://:***@h/db?x=1"
        );
        assert_eq!(redact_url("mysql://user@h/db"), "mysql://user@h/db");
        assert_eq!(redact_url("sqlite:///tmp/a.db"), "sqlite:///tmp/a.db");
        assert_eq!(redact_url("not a url"), "not a url");
    }
}
