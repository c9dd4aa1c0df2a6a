//! `connect` polled outside a Tokio runtime (by another executor) is an error for every
//! scheme this build serves, not a panic from the store's client ("this functionality
//! requires a Tokio context" for SQLite) nor a client whose leases are never renewed.

use std::future::Future;
use std::sync::Arc;
use std::task::{Context, Poll, Wake};

use distlock::ErrorKind;

/// The smallest executor that is not Tokio: polls on this thread, parks between wakes.
fn block_on<F: Future>(future: F) -> F::Output {
    struct Unpark(std::thread::Thread);
    impl Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = Arc::new(Unpark(std::thread::current())).into();
    let mut context = Context::from_waker(&waker);
    let mut future = std::pin::pin!(future);
    loop {
        if let Poll::Ready(output) = future.as_mut().poll(&mut context) {
            return output;
        }
        std::thread::park();
    }
}

#[test]
fn connect_outside_a_runtime_is_an_error_for_every_scheme() {
    let dir = tempfile::tempdir().unwrap();
    for scheme in distlock::supported_schemes() {
        // Valid URLs, of servers that do not listen (ports 1 to 3): the refusal must come
        // before any store is touched.
        let url = match scheme {
            "memory" => "memory://outside-tokio".to_string(),
            "sqlite" => format!("sqlite://{}", dir.path().join("locks.db").display()),
            "redis+redlock" | "rediss+redlock" => {
                format!("{scheme}://127.0.0.1:1,127.0.0.1:2,127.0.0.1:3")
            }
            _ => format!("{scheme}://user:hunter2@127.0.0.1:1/0"),
        };
        let err = match block_on(distlock::connect(&url)) {
            Ok(_) => panic!("{scheme}: connected outside a Tokio runtime"),
            Err(err) => err,
        };
        assert_eq!(err.kind(), ErrorKind::InvalidInput, "{scheme}: {err}");
        let text = err.to_string();
        assert!(text.contains("Tokio runtime"), "{scheme}: {text}");
        assert!(!text.contains("hunter2"), "{scheme}: {text}");
    }
}
