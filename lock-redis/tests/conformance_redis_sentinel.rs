//! The conformance suite against a primary with two replicas found through three
//! sentinels (`redis+sentinel://`), every grant confirmed by a replica (`replicas=1`).
//!
//! The scenarios that cut one client's link through a proxy are not registered: a proxy
//! in front of the sentinels is not in the data path (the client connects to the address
//! the sentinels name), and the connection code they test is the one `redis://` runs,
//! which `conformance_redis` proves.

mod support;

use std::sync::Arc;

use conformance_tests::factory::SessionEnder;
use conformance_tests::{BackendFactory, CountedStore, Failure, LinkControl, ServerFactory};
use lock_core::backend::{async_trait, DynBackend};

fn main() -> std::process::ExitCode {
    conformance_tests::run_suite_with(lock_redis::STORE, || async {
        let inner = ServerFactory::start(support::REDIS_SENTINEL).await?;
        Ok(vec![Arc::new(WithoutLink(inner)) as Arc<dyn BackendFactory>])
    })
}

/// The sentinel setup's factory, without clients whose link a scenario can cut.
#[deny(clippy::missing_trait_methods)]
struct WithoutLink(Arc<dyn BackendFactory>);

#[async_trait]
impl BackendFactory for WithoutLink {
    fn name(&self) -> String {
        self.0.name()
    }

    async fn connect(&self) -> lock_core::Result<DynBackend> {
        self.0.connect().await
    }

    async fn residue(&self, prefix: &str) -> lock_core::Result<Vec<String>> {
        self.0.residue(prefix).await
    }

    async fn connect_unreachable(&self) -> Option<lock_core::Result<DynBackend>> {
        self.0.connect_unreachable().await
    }

    async fn connect_with_link(
        &self,
    ) -> Option<lock_core::Result<(DynBackend, Arc<dyn LinkControl>)>> {
        None
    }

    fn shortest_ttl(&self) -> std::time::Duration {
        self.0.shortest_ttl()
    }

    fn hostile_keys(&self) -> &'static [&'static str] {
        self.0.hostile_keys()
    }

    fn counts_renewal_requests(&self) -> bool {
        self.0.counts_renewal_requests()
    }

    async fn counted_store(&self) -> Option<Result<Box<dyn CountedStore>, Failure>> {
        self.0.counted_store().await
    }

    fn servers(&self) -> Option<&ServerFactory> {
        self.0.servers()
    }

    fn session_ender(&self) -> Option<Arc<dyn SessionEnder>> {
        self.0.session_ender()
    }

    fn process_url(&self) -> Option<String> {
        self.0.process_url()
    }
}
