//! A batch applies its commands in order, answers each on its own, and is
//! equivalent to applying them one by one at the same cluster time.

use leasehold_core::{Command, JobSpec, Proposal, Refusal, Response, State};

fn enqueue(queue: &str) -> Command {
    Command::Enqueue { jobs: vec![JobSpec { queue: queue.into(), ..JobSpec::default() }] }
}

#[test]
fn a_batch_equals_its_commands_one_by_one() -> Result<(), String> {
    let commands = vec![
        enqueue("a"),
        enqueue("Bad Name"),
        Command::Claim {
            worker: "w".into(),
            queue: "a".into(),
            max: 1,
            lease_ttl_ms: None,
            selector: vec![],
        },
        Command::Ack { job_id: 1, token: 1, result: None },
        Command::Ack { job_id: 1, token: 7, result: None },
    ];
    let mut batched = State::new();
    let answer = batched.apply(
        1,
        &Proposal { now_ms: 1_000, command: Command::Batch { commands: commands.clone() } },
    );
    let mut single = State::new();
    let one_by_one: Vec<Response> = commands
        .into_iter()
        .map(|command| single.apply(1, &Proposal { now_ms: 1_000, command }))
        .collect();
    assert_eq!(answer, Response::Batch(one_by_one.clone()));
    assert!(matches!(one_by_one[1], Response::Refused(Refusal::Invalid(_))));
    assert_eq!(one_by_one[3], Response::Acked);
    assert!(matches!(one_by_one[4], Response::Refused(Refusal::StaleToken { .. })));
    let encode = |state: &State| bincode::serialize(state).map_err(|e| e.to_string());
    assert_eq!(encode(&batched)?, encode(&single)?);
    Ok(())
}

#[test]
fn batches_do_not_nest() {
    let mut state = State::new();
    let inner = Command::Batch { commands: vec![enqueue("a")] };
    let answer =
        state.apply(1, &Proposal { now_ms: 1, command: Command::Batch { commands: vec![inner] } });
    assert!(
        matches!(answer, Response::Refused(Refusal::Invalid(ref e)) if e.field == "commands[0]")
    );
    assert_eq!(state.last_job_id(), 0);
}
