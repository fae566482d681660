onefill::default_backend!(onefill::MemoryBackend::new());

#[derive(Debug)]
struct MyError;

impl std::fmt::Display for MyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("my error")
    }
}

impl std::error::Error for MyError {}

#[onefill::cached]
async fn user(id: u64) -> Result<String, MyError> {
    Ok(format!("user {id}"))
}

fn main() {}
