//! One entry per store, so a program that offers several stores picks one by URL scheme
//! from a table instead of a chain of `if`s (sqlx's `AnyDriver` is the model).

use std::fmt;
use std::future::Future;
use std::pin::Pin;

use super::DynBackend;
use crate::values::error::{Error, Result};

/// What [`Store::connect`] returns: the connection, boxed so every store's entry has one
/// type.
pub type Connecting<'a> = Pin<Box<dyn Future<Output = Result<DynBackend>> + Send + 'a>>;

/// A store a build can connect to: its name, the URL schemes it serves and how to
/// connect. Each backend crate exports one as `STORE`; the `distlock` facade keeps a
/// slice of them and connects through the entry whose schemes name the URL's.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> lock_core::Result<()> {
/// use std::sync::Arc;
/// use lock_core::backend::{DynBackend, Store};
/// use lock_core::{LockClient, MemoryBackend};
///
/// /// Every URL of this store opens a new in-process store.
/// const FRESH: Store = Store::new("fresh memory", &["fresh"], |_url| {
///     Box::pin(async { Ok(Arc::new(MemoryBackend::new()) as DynBackend) })
/// });
///
/// let url = "FRESH://anything";
/// let store = [FRESH].into_iter().find(|store| store.serves("fresh")).unwrap();
/// let client = LockClient::new(store.connect(url).await?);
/// client.try_lock("k").await?.release().await?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone, Copy)]
pub struct Store {
    name: &'static str,
    schemes: &'static [&'static str],
    connect: fn(&str) -> Connecting<'_>,
}

impl Store {
    /// An entry for the store `name`, serving the URL schemes `schemes` (lower case; only
    /// those this build can connect to) through `connect`, which is given the whole URL.
    pub const fn new(
        name: &'static str,
        schemes: &'static [&'static str],
        connect: fn(&str) -> Connecting<'_>,
    ) -> Self {
        Store {
            name,
            schemes,
            connect,
        }
    }

    /// The store's name, as in messages (`"redis"`).
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// The URL schemes this entry serves in this build.
    pub fn schemes(&self) -> &'static [&'static str] {
        self.schemes
    }

    /// Whether this entry serves the URL scheme `scheme` (in any case).
    pub fn serves(&self, scheme: &str) -> bool {
        self.schemes
            .iter()
            .any(|served| served.eq_ignore_ascii_case(scheme))
    }

    /// Connects to the store `url` names. Outside a Tokio runtime (polled by another
    /// executor) it is [`ErrorKind::InvalidInput`](crate::ErrorKind::InvalidInput) for
    /// every store, before the store is touched: the clients of the stores panic there,
    /// and without a runtime no lease would be renewed.
    pub fn connect<'a>(&self, url: &'a str) -> Connecting<'a> {
        if let Err(err) = require_runtime(self.name) {
            return Box::pin(std::future::ready(Err(err)));
        }
        (self.connect)(url)
    }
}

/// [`ErrorKind::InvalidInput`](crate::ErrorKind::InvalidInput) outside a Tokio runtime:
/// for a backend's connect functions to call before touching the store, because the
/// clients of the stores panic there ("this functionality requires a Tokio context") and
/// without a runtime no lease would be renewed. `store` names the store in the message.
pub fn require_runtime(store: &str) -> Result<()> {
    match tokio::runtime::Handle::try_current() {
        Ok(_) => Ok(()),
        Err(_) => Err(Error::invalid(format!(
            "{store} needs a Tokio runtime, and connect was called outside one: call it \
             from a Tokio runtime (`#[tokio::main]`, `Runtime::block_on`)"
        ))),
    }
}

impl fmt::Debug for Store {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Store")
            .field("name", &self.name)
            .field("schemes", &self.schemes)
            .finish_non_exhaustive()
    }
}
