#[onefill::cached(ttl = "5m", skip(pool))]
pub async fn user(id: u64, pool: &Pool) -> anyhow::Result<User> {
    pool.user(id).await
}
