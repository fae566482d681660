onefill::default_backend!(onefill::MemoryBackend::new());

type Found = Option<String>;

#[onefill::cached]
fn user(id: u64) -> Found {
    Some(format!("user {id}"))
}

fn main() {}
