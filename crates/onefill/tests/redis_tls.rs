//! `rediss://` against a private TLS-enabled redis-server (feature `tls`),
//! with a throwaway CA made by the `openssl` command. Without the feature,
//! a `rediss://` URL is a clear error (`cargo test -p onefill --test
//! redis_tls`; a `cargo test --workspace` builds the library with TLS, for
//! the CLI).

#[cfg(not(feature = "tls"))]
#[tokio::test]
async fn rediss_without_the_tls_feature_is_a_clear_error() {
    let err = onefill::redis::RedisBackend::connect("rediss://127.0.0.1:1")
        .await
        .unwrap_err();
    assert!(err.message().contains("`tls` cargo feature"), "{err}");
    assert!(!err.is_transient());
}

#[cfg(feature = "tls")]
mod tls {
    use std::net::TcpListener;
    use std::path::PathBuf;
    use std::process::Command;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    use onefill::redis::{RedisBackend, RedisOptions};
    use onefill::Cache;
    use onefill_testkit::{time_limit, RedisServer};

    /// Seconds of work on a private server; past this it hangs.
    const LIMIT: Duration = Duration::from_secs(60);

    /// A CA and a server certificate for localhost/127.0.0.1, in a temp dir
    /// removed on drop.
    struct Certs {
        dir: PathBuf,
    }

    impl Drop for Certs {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }

    impl Certs {
        fn make() -> Certs {
            static NEXT: AtomicUsize = AtomicUsize::new(0);
            let dir = std::env::temp_dir().join(format!(
                "onefill-tls-{}-{}",
                std::process::id(),
                NEXT.fetch_add(1, Ordering::Relaxed)
            ));
            std::fs::create_dir_all(&dir).unwrap();
            let run = |args: &[&str]| {
                let out = Command::new("openssl")
                    .args(args)
                    .current_dir(&dir)
                    .output()
                    .expect("the openssl command (installed by .ci/run)");
                assert!(
                    out.status.success(),
                    "openssl {args:?}: {}",
                    String::from_utf8_lossy(&out.stderr)
                );
            };
            run(&[
                "req",
                "-x509",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-keyout",
                "ca.key",
                "-out",
                "ca.crt",
                "-days",
                "2",
                "-subj",
                "/CN=onefill-test-ca",
            ]);
            run(&[
                "req",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-keyout",
                "server.key",
                "-out",
                "server.csr",
                "-subj",
                "/CN=localhost",
            ]);
            std::fs::write(
                dir.join("ext"),
                "subjectAltName=DNS:localhost,IP:127.0.0.1\n",
            )
            .unwrap();
            run(&[
                "x509",
                "-req",
                "-in",
                "server.csr",
                "-CA",
                "ca.crt",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-out",
                "server.crt",
                "-days",
                "2",
                "-extfile",
                "ext",
            ]);
            Certs { dir }
        }
        fn path(&self, name: &str) -> String {
            self.dir.join(name).display().to_string()
        }
        fn ca_pem(&self) -> Vec<u8> {
            std::fs::read(self.dir.join("ca.crt")).unwrap()
        }
    }

    fn free_port() -> u16 {
        TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port()
    }

    /// The server keeps its plain port for the harness's readiness check and
    /// raw commands; clients use the TLS port.
    fn tls_server(certs: &Certs, extra: &[&str]) -> (RedisServer, u16) {
        let port = free_port();
        let port_s = port.to_string();
        let (cert, key, ca) = (
            certs.path("server.crt"),
            certs.path("server.key"),
            certs.path("ca.crt"),
        );
        let mut args = vec![
            "--tls-port",
            &port_s,
            "--tls-cert-file",
            &cert,
            "--tls-key-file",
            &key,
            "--tls-ca-cert-file",
            &ca,
            "--tls-auth-clients",
            "no",
        ];
        args.extend_from_slice(extra);
        (RedisServer::start_with(&args), port)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn herd_over_tls_with_auth_is_one_load() {
        let _limit = time_limit(LIMIT);
        let certs = Certs::make();
        let (_server, port) = tls_server(&certs, &["--requirepass", "s3cret"]);
        let url = format!("rediss://:s3cret@localhost:{port}");
        let loads = Arc::new(AtomicUsize::new(0));
        let mut pods = Vec::new();
        for _ in 0..2 {
            let backend =
                RedisBackend::connect_with(&url, RedisOptions::new().tls_root_cert(certs.ca_pem()))
                    .await
                    .expect("TLS connect with the test CA");
            pods.push(
                Cache::<String, String>::builder()
                    .namespace("tls")
                    .backend(backend)
                    .build()
                    .unwrap(),
            );
        }
        let mut tasks = Vec::new();
        for i in 0..100 {
            let cache = pods[i % 2].clone();
            let loads = loads.clone();
            tasks.push(tokio::spawn(async move {
                cache
                    .get_or_load(&"k".to_string(), move |k| async move {
                        loads.fetch_add(1, Ordering::SeqCst);
                        tokio::time::sleep(Duration::from_millis(200)).await;
                        Ok::<_, std::io::Error>(format!("{k}!"))
                    })
                    .await
            }));
        }
        for t in tasks {
            assert_eq!(t.await.unwrap().unwrap(), "k!");
        }
        assert_eq!(loads.load(Ordering::SeqCst), 1);
        let waits: u64 = pods.iter().map(|p| p.stats().wait_notified).sum();
        assert!(waits >= 1, "the notification connection works over TLS too");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_untrusted_server_certificate_is_refused() {
        let _limit = time_limit(LIMIT);
        let certs = Certs::make();
        let (_server, port) = tls_server(&certs, &[]);
        let url = format!("rediss://localhost:{port}");
        // The system trust store does not know the test CA.
        let err = RedisBackend::connect(&url).await.unwrap_err();
        assert!(!err.message().is_empty());
    }
}
