onefill::default_backend!(onefill::MemoryBackend::new());

struct Users;

impl Users {
    #[onefill::cached]
    async fn user(&self, id: u64) -> anyhow::Result<String> {
        Ok(format!("user {id}"))
    }
}

fn main() {}
