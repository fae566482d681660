//! What `--fault` does, when, and what the injectors saw doing it: the
//! vocabulary the flags, the injectors and the reports share.

use serde::{Deserialize, Serialize};

/// What `--fault` does: to a master of a cluster (`failover`, `kill`,
/// `hang`), or to the worker process holding a lease (`kill-holder`,
/// `stop-holder`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FaultKind {
    /// `CLUSTER FAILOVER` sent to a replica of the victim: the replica
    /// becomes the master and the victim its replica (and they stay so
    /// after the run).
    Failover,
    /// SIGKILL of the victim's redis-server process (which must run on this
    /// machine, on a loopback address): the node stays dead after the run.
    Kill,
    /// SIGSTOP of the victim's process (same machine), a host that hangs
    /// with its connections open; SIGCONT when the run ends (always, even
    /// if the fleet fails), after which it rejoins as a replica.
    Hang,
    /// SIGKILL of the worker process holding the lease of a key (a herd on
    /// one server): another process must take the load over.
    KillHolder,
    /// SIGSTOP of the worker process holding the lease of a key (a herd on
    /// one server), a process that hangs with its lease and connections;
    /// SIGCONT when the other processes have answered (always, even if the
    /// fleet fails). Its late answers are reported apart.
    StopHolder,
}

impl FaultKind {
    /// The kill(1) signal that injects it (none for a failover).
    pub fn signal(self) -> Option<&'static str> {
        match self {
            FaultKind::Failover => None,
            FaultKind::Kill | FaultKind::KillHolder => Some("-KILL"),
            FaultKind::Hang | FaultKind::StopHolder => Some("-STOP"),
        }
    }

    /// Whether it faults a lease holder (a worker) rather than a master.
    pub fn is_holder(self) -> bool {
        matches!(self, FaultKind::KillHolder | FaultKind::StopHolder)
    }
}

/// When and what to inject.
#[derive(Debug, Clone, Copy)]
pub struct FaultPlan {
    /// The fault.
    pub kind: FaultKind,
    /// Milliseconds after the parent's "go".
    pub at_ms: u64,
}

/// What the injector did and saw.
#[derive(Debug, Clone, PartialEq)]
pub struct Injected {
    /// The fault.
    pub kind: FaultKind,
    /// `ip:port` of the victim master.
    pub victim: String,
    /// The victim's process id (kill and hang).
    pub victim_pid: Option<u32>,
    /// Indices (into the run's keys) of the keys the victim served.
    pub victim_keys: Vec<usize>,
    /// When the fault was injected, ms after "go".
    pub fault_at_ms: f64,
    /// When a healthy master first saw every victim slot served by another
    /// node, ms after "go"; `None` if not within the run.
    pub promoted_at_ms: Option<f64>,
    /// `ip:port` of the node serving the victim's slots then.
    pub promoted_to: Option<String>,
    /// The values found on the old primary and looked for on the new one
    /// (a Sentinel set-up; `None` on a cluster, or without a promotion).
    pub values: Option<ValueCheck>,
}

/// The run's values looked for on the new primary right after a
/// promotion, against the old primary's as last read (just before the
/// fault; for a failover, again at the promotion, the old primary still
/// answering).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ValueCheck {
    /// Values the old primary held that should still have lived at the
    /// check by far (more than the margin), so no refresh could have
    /// replaced them.
    pub checked: u64,
    /// Of those, the ones missing on the new primary, or replaced there by
    /// a younger value (a longer remaining TTL than the old value had
    /// left): acknowledged fills that did not survive the promotion.
    pub vanished: u64,
    /// The indices (into the run's keys) of the vanished values.
    pub vanished_keys: Vec<usize>,
    /// How long a value had to have left at the check to be checked, ms.
    pub margin_ms: u64,
    /// After a failover, writes the old primary took after the promotion,
    /// while it still answered as a master (polled every 100 ms to the end
    /// of the run, or until it answers as a replica): a value it holds
    /// that it did not hold at the promotion, or a younger one. The new
    /// primary never gets them, and the old one drops them when it is
    /// made a replica. Writes between two polls to one key count once.
    #[serde(default)]
    pub old_primary_writes: u64,
    /// The keys (indices) of those writes.
    #[serde(default)]
    pub old_primary_written_keys: Vec<usize>,
    /// When the old primary first answered as a replica, ms after "go"
    /// (`None`: not within the run, or not watched).
    #[serde(default)]
    pub old_primary_demoted_at_ms: Option<f64>,
}
