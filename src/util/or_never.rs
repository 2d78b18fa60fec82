//! A small helper for `select!` loops whose branches apply only sometimes.

/// Awaits `future` if there is one; otherwise never completes (a branch of
/// a `select!` that does not apply right now).
pub async fn or_never<F: std::future::Future>(future: Option<F>) -> F::Output {
    match future {
        Some(future) => future.await,
        None => std::future::pending().await,
    }
}
