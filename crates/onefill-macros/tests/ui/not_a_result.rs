onefill::default_backend!(onefill::MemoryBackend::new());

#[onefill::cached]
fn user(id: u64) -> String {
    format!("user {id}")
}

fn main() {}
