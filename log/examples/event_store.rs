//! The course-subscription case of Dynamic Consistency Boundaries (dcb.events), on the log, with
//! a projection fed through a lane.
//!
//! Courses hold at most `--capacity` students; a student takes at most `--max-courses` courses.
//! Students subscribe concurrently from several threads, and nothing but the log's append
//! conditions keeps those two rules: each attempt reads its decision model with one query (the
//! course's definition and subscriptions, and the student's subscriptions), decides, and appends
//! `StudentSubscribed` with `AppendCondition { fail_if_events_match: <the same query>, after:
//! <the head it read> }`; on `Conflict` it reads again and decides again. No lock, no
//! per-course state outside the log.
//!
//! A `LogSource`, run by the pipeline driver (`lanestream::pipeline::Pipeline`), publishes every
//! append as one batch into a `MemoryStream`'s lane `projection`, whose sink builds "course -> students" from the envelopes and acks. The summary checks that no
//! course is over capacity and no student over the limit (on a full re-read of the log), that the
//! projection equals that re-read, and that the watermark reached the log's head; it ends with a
//! `PASS: ...` or `FAIL: ...` line, and the exit status matches.
//!
//! ```text
//! cargo run --release -p lanestream-log --example event_store [-- --students 40 --courses 12 --capacity 10
//!     --max-courses 3 --threads 8 --attempts 10 --dir DIR]
//! ```
//! `--dir DIR` keeps the log on disk (durable: each reply after its fsync); by default it lives
//! in memory.

use lanestream::prelude::*;
use std::collections::{BTreeMap, BTreeSet};
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread;
use std::time::Instant;

use lanestream::pipeline::Pipeline;
use lanestream::{IndexName, LaneItem, MemoryStream, Position, Stream};
use lanestream_log::{
    AppendCondition, AppendError, Event, EventLog, LogOptions, LogSource, Query, QueryItem, WriteHandle,
};

struct Args {
    students: u32,
    courses: u32,
    capacity: usize,
    max_courses: usize,
    threads: u32,
    attempts: u32,
    dir: Option<std::path::PathBuf>,
}

fn parse_args() -> Result<Args, String> {
    let mut a =
        Args { students: 40, courses: 12, capacity: 10, max_courses: 3, threads: 8, attempts: 10, dir: None };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        if flag == "--help" || flag == "-h" {
            return Err("usage: event_store [--students N] [--courses N] [--capacity N] [--max-courses N] \
                 [--threads N] [--attempts N] [--dir DIR]"
                .into());
        }
        let value = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
        let num = |v: &str| v.parse::<u32>().map_err(|e| format!("{flag} {v}: {e}"));
        match flag.as_str() {
            "--students" => a.students = num(&value)?,
            "--courses" => a.courses = num(&value)?.max(1),
            "--capacity" => a.capacity = num(&value)? as usize,
            "--max-courses" => a.max_courses = num(&value)? as usize,
            "--threads" => a.threads = num(&value)?.max(1),
            "--attempts" => a.attempts = num(&value)?,
            "--dir" => a.dir = Some(value.into()),
            _ => return Err(format!("unknown flag {flag} (--help lists them)")),
        }
    }
    Ok(a)
}

fn course_tag(c: u32) -> String {
    format!("course:{c}")
}

fn student_tag(s: u32) -> String {
    format!("student:{s}")
}

/// The decision model of "student `s` subscribes to course `c`": the course's definition and
/// subscriptions, and the student's subscriptions. One query, so one append condition covers it.
fn decision_query(s: u32, c: u32) -> Query {
    Query::items([
        QueryItem::new(["CourseDefined", "StudentSubscribed"], [course_tag(c)]),
        QueryItem::new(["StudentSubscribed"], [student_tag(s)]),
    ])
    .expect("two items")
}

#[derive(Default)]
struct Counts {
    subscribed: AtomicU64,
    course_full: AtomicU64,
    student_at_limit: AtomicU64,
    already: AtomicU64,
    conflicts: AtomicU64,
}

enum Outcome {
    Subscribed,
    CourseFull,
    StudentAtLimit,
    Already,
}

/// One attempt, retried on conflict until the decision holds.
fn subscribe(
    log: &WriteHandle,
    s: u32,
    c: u32,
    max_courses: usize,
    counts: &Counts,
) -> Result<Outcome, AppendError> {
    let query = decision_query(s, c);
    let (ct, st) = (course_tag(c), student_tag(s));
    loop {
        let seen = log.read(&query, None, usize::MAX).unwrap();
        assert!(!seen.is_cut_short());
        let mut capacity = None;
        let (mut in_course, mut of_student, mut already) = (0, 0, false);
        for e in seen.events() {
            let e = &e.event;
            match e.event_type() {
                "CourseDefined" => {
                    let text = std::str::from_utf8(e.data()).expect("utf-8");
                    capacity = text.strip_prefix("capacity=").and_then(|n| n.parse::<usize>().ok());
                }
                "StudentSubscribed" => {
                    let (here, mine) = (e.has_tag(&ct), e.has_tag(&st));
                    in_course += usize::from(here);
                    of_student += usize::from(mine);
                    already |= here && mine;
                }
                _ => {}
            }
        }
        let capacity = capacity.expect("every course is defined before anyone subscribes");
        if already {
            return Ok(Outcome::Already);
        }
        if in_course >= capacity {
            return Ok(Outcome::CourseFull);
        }
        if of_student >= max_courses {
            return Ok(Outcome::StudentAtLimit);
        }
        let event = Event::new("StudentSubscribed", [ct.clone(), st.clone()], format!("{c} {s}"))
            .expect("valid names");
        match log.append(vec![event], Some(AppendCondition::new(query.clone(), seen.head()))) {
            Ok(_) => return Ok(Outcome::Subscribed),
            Err(AppendError::Conflict { .. }) => {
                counts.conflicts.fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => return Err(e),
        }
    }
}

/// A small deterministic generator (xorshift64*), so runs are repeatable without a dependency.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u32) -> u32 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 33) as u32 % n
    }
}

type Enrolment = BTreeMap<u32, BTreeSet<u32>>;

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    match run(&args) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            println!("FAIL: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: &Args) -> Result<bool, Box<dyn std::error::Error>> {
    let log = match &args.dir {
        Some(dir) => EventLog::open(dir, LogOptions::default())?,
        None => EventLog::in_memory(LogOptions::default())?,
    };
    if log.head().is_some() {
        return Err("the log directory is not empty; give a fresh --dir".into());
    }
    let started = Instant::now();

    // The lane and its projection sink.
    let stream = MemoryStream::builder().capacity(64).sinks(["projection"]).build()?;
    let mut source = LogSource::builder(log.reader())
        .index(IndexName::new("subscriptions")?, Query::types(["StudentSubscribed"]))
        .build(&stream)?;
    let mut consumer = stream.attach("projection")?;
    let projection = thread::spawn(move || -> Result<(Enrolment, u64), String> {
        let mut enrolment = Enrolment::new();
        let mut batches = 0;
        while let Some(delivery) = consumer.recv().map_err(|e| e.to_string())? {
            if let LaneItem::Batch(batch) = delivery.item() {
                batches += 1;
                for envelope in batch.envelopes.iter() {
                    let text = std::str::from_utf8(&envelope.document).map_err(|e| e.to_string())?;
                    let (c, s) = text.split_once(' ').ok_or("a malformed subscription")?;
                    let (c, s) = (c.parse().map_err(|_| "course")?, s.parse().map_err(|_| "student")?);
                    enrolment.entry(c).or_default().insert(s);
                }
            }
            delivery.ack().map_err(|e| e.to_string())?;
        }
        Ok((enrolment, batches))
    });
    // The driver: until the log closes and the projection acked everything; then it closes
    // the lane.
    let pipeline = Pipeline::new(stream.clone());
    let source = thread::spawn(move || {
        pipeline.run(&mut source)?;
        Ok::<_, lanestream::pipeline::PipelineError>(source.stats().clone())
    });

    // The courses, each defined once (a condition on its own tag).
    for c in 0..args.courses {
        let defined = Event::new("CourseDefined", [course_tag(c)], format!("capacity={}", args.capacity))?;
        log.append(vec![defined], Some(AppendCondition::new(Query::tags([course_tag(c)]), None)))?;
    }

    // Students subscribe concurrently: thread t handles the students s with s % threads == t.
    let counts = Arc::new(Counts::default());
    let workers: Vec<_> = (0..args.threads)
        .map(|t| {
            let (log, counts) = (log.clone(), counts.clone());
            let (students, courses, attempts, threads) =
                (args.students, args.courses, args.attempts, args.threads);
            let max_courses = args.max_courses;
            thread::spawn(move || -> Result<(), AppendError> {
                let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ (u64::from(t) + 1));
                // Interleave the students of this thread attempt by attempt, so every course is
                // contended by every thread at once.
                for _ in 0..attempts {
                    for s in (t..students).step_by(threads as usize) {
                        let c = rng.below(courses);
                        let counter = match subscribe(&log, s, c, max_courses, &counts)? {
                            Outcome::Subscribed => &counts.subscribed,
                            Outcome::CourseFull => &counts.course_full,
                            Outcome::StudentAtLimit => &counts.student_at_limit,
                            Outcome::Already => &counts.already,
                        };
                        counter.fetch_add(1, Ordering::Relaxed);
                    }
                }
                Ok(())
            })
        })
        .collect();
    for w in workers {
        w.join().map_err(|_| "a student thread panicked")??;
    }
    let head = log.head().ok_or("the log is empty")?;
    log.close();
    let source_stats = source.join().map_err(|_| "the source thread panicked")??;
    let (projected, batches) = projection.join().map_err(|_| "the projection thread panicked")??;
    let elapsed = started.elapsed();

    // The truth: a full re-read of the log.
    let mut truth = Enrolment::new();
    let mut per_student: BTreeMap<u32, usize> = BTreeMap::new();
    let mut duplicates = 0;
    for e in log.read(&Query::types(["StudentSubscribed"]), None, usize::MAX).unwrap() {
        let text = std::str::from_utf8(e.event.data())?;
        let (c, s) = text.split_once(' ').ok_or("a malformed subscription")?;
        let (c, s): (u32, u32) = (c.parse()?, s.parse()?);
        if !truth.entry(c).or_default().insert(s) {
            duplicates += 1;
        }
        *per_student.entry(s).or_default() += 1;
    }
    let over_capacity: Vec<(u32, usize)> =
        truth.iter().map(|(c, s)| (*c, s.len())).filter(|(_, n)| *n > args.capacity).collect();
    let over_limit = per_student.values().filter(|n| **n > args.max_courses).count();
    let subscriptions: usize = truth.values().map(BTreeSet::len).sum();
    let full_courses = truth.values().filter(|s| s.len() == args.capacity).count();
    let load = |a: &AtomicU64| a.load(Ordering::Relaxed);

    println!(
        "event_store: {} students, {} courses of capacity {}, at most {} courses per student,",
        args.students, args.courses, args.capacity, args.max_courses
    );
    println!(
        "  {} threads x {} attempts per student, log {}",
        args.threads,
        args.attempts,
        if args.dir.is_some() { "on disk" } else { "in memory" }
    );
    println!(
        "attempts: {} subscribed, {} course full, {} student at limit, {} already subscribed; {} conflicts retried",
        load(&counts.subscribed),
        load(&counts.course_full),
        load(&counts.student_at_limit),
        load(&counts.already),
        load(&counts.conflicts)
    );
    println!(
        "log: head {head}, {subscriptions} subscriptions, {full_courses} of {} courses full, {:.0?}",
        args.courses, elapsed
    );
    println!(
        "source: {} appends published; the projection received {batches} batches; watermark {:?}",
        source_stats.appends,
        stream.watermark().map(|p| p.0)
    );
    for (c, students) in &truth {
        println!(
            "  course {c:>3}: {:>3}/{} {:?}",
            students.len(),
            args.capacity,
            students.iter().take(12).collect::<Vec<_>>()
        );
    }

    let mut failures = Vec::new();
    if !over_capacity.is_empty() {
        failures.push(format!("courses over capacity: {over_capacity:?}"));
    }
    if over_limit > 0 {
        failures.push(format!("{over_limit} students over the limit of {}", args.max_courses));
    }
    if duplicates > 0 {
        failures.push(format!("{duplicates} duplicate subscriptions"));
    }
    if subscriptions as u64 != load(&counts.subscribed) {
        failures.push(format!(
            "{} acknowledged subscriptions but {subscriptions} in the log",
            load(&counts.subscribed)
        ));
    }
    if projected != truth {
        failures.push("the projection differs from a full re-read of the log".into());
    }
    if stream.watermark() != Some(Position::from(head)) {
        failures.push(format!("watermark {:?}, expected the log's head {head}", stream.watermark()));
    }
    if source_stats.appends != batches {
        failures.push(format!("{} appends published, {batches} batches received", source_stats.appends));
    }
    if failures.is_empty() {
        println!(
            "PASS: {subscriptions} subscriptions, no course over {} and no student over {} ({} conflicts retried); projection == re-read ({batches} batches, watermark {head})",
            args.capacity,
            args.max_courses,
            load(&counts.conflicts)
        );
        Ok(true)
    } else {
        println!("FAIL: {}", failures.join("; "));
        Ok(false)
    }
}
