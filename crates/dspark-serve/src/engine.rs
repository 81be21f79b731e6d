//! The engine thread: owns the models and runs the requests of a bounded FIFO — one at a time
//! ([`Models::Solo`]), or together in batched rounds ([`Models::Batched`], `batched.rs`).

use crate::metrics::Metrics;
use dspark_model::checkpoint::chat_template::ChatTemplate;
use dspark_model::checkpoint::detok::IncrementalDecoder;
use dspark_model::checkpoint::generation_config::SamplingDefaults;
use dspark_model::checkpoint::tokenizer::Tokenizer;
use dspark_model::{BatchDrafter, BatchTarget, Drafter, TargetModel};
use dspark_spec::{
    sample, speculative, speculative_sampled, DraftLaw, Emitted, GenerateOptions, SamplingParams, StopReason,
    TokenLogprob, VerifyLen,
};
use std::ops::ControlFlow;
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, OnceLock};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};

/// The models, and how requests share them.
pub enum Models {
    /// One request at a time through the plain loops.
    Solo { target: Box<dyn TargetModel>, draft: Option<Box<dyn Drafter>> },
    /// Continuous batching (`--max-batch`): up to `max_batch` requests — greedy or sampled,
    /// logprobs included — share each round (`dspark_spec::Scheduler`).
    Batched { target: Box<dyn BatchTarget>, draft: Box<dyn BatchDrafter>, max_batch: usize },
}

impl Models {
    /// Positions one request may hold.
    fn max_len(&self) -> usize {
        match self {
            Models::Solo { target, .. } => target.max_len(),
            Models::Batched { target, .. } => target.max_len(),
        }
    }
}

/// What the server runs: the models and what it needs to read and write text.
pub struct Engine {
    pub models: Models,
    pub tokenizer: Arc<Tokenizer>,
    /// The model folder's chat template (Qwen3's built-in format without one).
    pub chat_template: Arc<ChatTemplate>,
    /// Ids that end a generation (generation_config.json's, then config.json's).
    pub eos_token_ids: Vec<u32>,
    /// generation_config.json's settings for the fields a request omits (greedy when none).
    pub defaults: SamplingDefaults,
    /// How many drafts a round verifies (with a draft).
    pub verify_len: VerifyLen,
    /// The draft's law when sampling.
    pub law: DraftLaw,
}

/// Builds the [`Engine`] on the engine thread; the server answers 503 on `/health` meanwhile.
pub type Loader = Box<dyn FnOnce() -> anyhow::Result<Engine> + Send>;

/// What the request side needs once the models are loaded.
pub struct Ready {
    pub tokenizer: Arc<Tokenizer>,
    pub chat_template: Arc<ChatTemplate>,
    /// The prompt + max tokens must fit in this many positions.
    pub context: usize,
    pub defaults: SamplingDefaults,
    /// The ids that end a generation (their text is none, in logprobs too).
    pub eos_token_ids: Vec<u32>,
}

/// What a request asks of the engine (everything but its channel).
#[derive(Clone, Debug)]
pub struct Request {
    pub prompt: Vec<u32>,
    pub max_tokens: usize,
    /// Choice 0's; choice `i` samples with `seed + i` (wrapping), each from its own stream.
    pub params: SamplingParams,
    pub stop: Vec<String>,
    /// Choices, generated one after another (1 ..= 16, checked by the API).
    pub n: usize,
    /// `Some(k)`: report each token's logprob and its row's `k` most likely ids.
    pub logprobs: Option<usize>,
}

/// One request for the engine.
pub struct Job {
    pub req: Request,
    pub tx: UnboundedSender<Event>,
}

/// A generated token's logprob, as the loops report it ([`dspark_spec::logprobs`]).
#[derive(Clone, Debug)]
pub struct Logprob {
    pub id: u32,
    pub lp: TokenLogprob,
}

/// What the engine sends back on a request's channel. Choices come in order: all of choice
/// `i`'s events, ending with its `Done`, before choice `i + 1`'s.
#[derive(Debug)]
pub enum Event {
    /// New complete text of choice `index`, with the logprobs of the tokens taken since the
    /// previous event (empty unless asked; a token that completed no text yet travels with a
    /// later event, an eos id's with the last, whose text may be empty). Concatenated, a
    /// choice's events give its whole text and one logprob per generated token.
    Text {
        index: usize,
        text: String,
        logprobs: Vec<Logprob>,
    },
    Done {
        index: usize,
        done: Done,
    },
    Error(String),
}

#[derive(Debug)]
pub struct Done {
    /// `stop` (an eos id or a stop string) or `length`.
    pub finish_reason: &'static str,
    pub prompt_tokens: usize,
    pub tokens: Vec<u32>,
    /// Speculative rounds and mean committed tokens per round (`None` without a draft).
    pub spec: Option<(usize, f64)>,
}

/// The request side's handle on the engine.
pub struct Handle {
    queue: SyncSender<Job>,
    pub ready: Arc<OnceLock<Ready>>,
    /// Set when loading failed; `/health` reports it.
    pub failed: Arc<OnceLock<String>>,
    metrics: Arc<Metrics>,
}

pub enum SubmitError {
    Full,
    Gone,
}

impl Handle {
    /// Queues a job; the receiver gets its events.
    pub fn submit(&self, req: Request) -> Result<UnboundedReceiver<Event>, SubmitError> {
        let (tx, rx) = unbounded_channel();
        self.metrics.queue_depth.inc();
        match self.queue.try_send(Job { req, tx }) {
            Ok(()) => Ok(rx),
            Err(e) => {
                self.metrics.queue_depth.dec();
                Err(match e {
                    TrySendError::Full(_) => SubmitError::Full,
                    TrySendError::Disconnected(_) => SubmitError::Gone,
                })
            }
        }
    }
}

/// Starts the engine thread: it loads the models, publishes [`Ready`], then serves the queue.
pub fn start(max_queue: usize, max_context: usize, load: Loader, metrics: Arc<Metrics>) -> anyhow::Result<Handle> {
    let (queue, rx) = sync_channel::<Job>(max_queue);
    let ready = Arc::new(OnceLock::new());
    let failed = Arc::new(OnceLock::new());
    let (r, f, m) = (ready.clone(), failed.clone(), metrics.clone());
    std::thread::Builder::new().name("dspark-engine".into()).spawn(move || match load() {
        Ok(engine) => {
            let context = max_context.min(engine.models.max_len());
            let _ = r.set(Ready {
                tokenizer: Arc::clone(&engine.tokenizer),
                chat_template: Arc::clone(&engine.chat_template),
                context,
                defaults: engine.defaults,
                eos_token_ids: engine.eos_token_ids.clone(),
            });
            eprintln!("dspark serve: models loaded, ready");
            serve_queue(engine, rx, &m);
        }
        Err(e) => {
            eprintln!("dspark serve: loading failed: {e:#}");
            let _ = f.set(format!("{e:#}"));
        }
    })?;
    Ok(Handle { queue, ready, failed, metrics })
}

fn serve_queue(mut engine: Engine, rx: Receiver<Job>, metrics: &Metrics) {
    if matches!(engine.models, Models::Batched { .. }) {
        return crate::batched::serve(engine, rx, metrics);
    }
    for job in rx {
        metrics.queue_depth.dec();
        if job.tx.is_closed() {
            continue;
        }
        run_job(&mut engine, job, metrics);
    }
}

/// Per-request text state: the generated ids, their text so far (decoded incrementally: each
/// token costs a decode of the few ids since the last complete character, not of them all), how
/// much of it was sent, stop strings.
pub(crate) struct TextState {
    index: usize,
    decoder: IncrementalDecoder<Arc<Tokenizer>>,
    /// The text of `ids` as far as it is complete (an eos id contributes none).
    text: String,
    eos: Arc<[u32]>,
    stop: Arc<[String]>,
    tx: UnboundedSender<Event>,
    ids: Vec<u32>,
    /// Logprobs of tokens whose text has not been sent yet.
    pending: Vec<Logprob>,
    /// Bytes of the decoded text already sent.
    sent: usize,
    /// A stop string matched: generation ended there.
    stopped: bool,
    failure: Option<String>,
}

impl TextState {
    pub(crate) fn new(engine: &Engine, job: &Job, index: usize) -> TextState {
        TextState {
            index,
            decoder: IncrementalDecoder::new(Arc::clone(&engine.tokenizer)),
            text: String::new(),
            eos: engine.eos_token_ids.clone().into(),
            stop: job.req.stop.clone().into(),
            tx: job.tx.clone(),
            ids: Vec::new(),
            pending: Vec::new(),
            sent: 0,
            stopped: false,
            failure: None,
        }
    }

    /// Sends an event on the choice's request channel.
    pub(crate) fn tx_send(&self, e: Event) -> bool {
        self.tx.send(e).is_ok()
    }

    /// Takes a generated id into the text (an eos id adds none; the decoder holds back an
    /// incomplete character until it completes, and `last` flushes it).
    fn take(&mut self, e: Option<&Emitted>, last: bool) -> Result<(), String> {
        if let Some(e) = e {
            let id = e.token;
            self.ids.push(id);
            if let Some(lp) = &e.logprob {
                self.pending.push(Logprob { id, lp: lp.clone() });
            }
            if !self.eos.contains(&id) {
                self.text += &self.decoder.push(id).map_err(|e| e.to_string())?;
            }
        }
        if last {
            self.text += &self.decoder.finish().map_err(|e| e.to_string())?;
        }
        Ok(())
    }

    /// Takes `id` (none at the end) and sends what became final; returns false when generation
    /// must end (stop string, client gone, decode failure).
    pub(crate) fn advance(&mut self, e: Option<&Emitted>, last: bool) -> bool {
        if let Err(e) = self.take(e, last) {
            self.failure = Some(e);
            return false;
        }
        let text = &self.text;
        // Text already sent never changes; if a decoder rewrote it, send only from the boundary.
        let from = if text.is_char_boundary(self.sent) { self.sent } else { text.len() };
        // A complete stop string anywhere past what was sent (it may start before `from` only
        // inside held-back text, which was never sent, so searching from `from` suffices).
        let hit = self.stop.iter().filter_map(|s| text[from..].find(s.as_str()).map(|i| from + i)).min();
        let end = match hit {
            Some(i) => i,
            None if last => text.len(),
            None => hold_back(text, from, &self.stop),
        };
        self.stopped = hit.is_some();
        // The logprobs of the tokens taken so far go out with the next text sent; at the end
        // (or a stop string) all that are left go, with no text if none is left.
        if end > from || (!self.pending.is_empty() && (last || self.stopped)) {
            let logprobs = std::mem::take(&mut self.pending);
            let _ = self.tx.send(Event::Text { index: self.index, text: text[from..end].to_string(), logprobs });
            self.sent = end;
        }
        !self.stopped && !self.tx.is_closed()
    }
}

/// Where the text can be sent up to: before the longest suffix that begins some stop string.
fn hold_back(text: &str, from: usize, stop: &[String]) -> usize {
    let mut end = text.len();
    for s in stop {
        for (i, _) in s.char_indices().skip(1) {
            if text.ends_with(&s[..i]) {
                end = end.min(text.len() - i);
            }
        }
    }
    end.max(from)
}

/// Runs a request's choices one after another; stops at the first that fails or finds the
/// client gone.
fn run_job(engine: &mut Engine, job: Job, metrics: &Metrics) {
    for index in 0..job.req.n {
        let seed = job.req.params.seed.wrapping_add(index as u64);
        let params = SamplingParams { seed, ..job.req.params };
        let mut st = TextState::new(engine, &job, index);
        let Engine { models: Models::Solo { target, draft }, eos_token_ids, verify_len, law, .. } = engine else {
            return;
        };
        let draft: Option<&mut dyn Drafter> = match draft {
            Some(d) => Some(d.as_mut()),
            None => None,
        };
        let result = run_loops(target.as_mut(), draft, &job.req, eos_token_ids, (verify_len, *law), params, &mut st);
        if !finish_choice(&mut st, result, job.req.prompt.len(), metrics) {
            return;
        }
    }
}

/// One choice through the plain loops (speculative with a draft), its tokens into `st`.
fn run_loops(
    target: &mut dyn TargetModel,
    draft: Option<&mut dyn Drafter>,
    req: &Request,
    eos: &[u32],
    (verify_len, law): (&VerifyLen, DraftLaw),
    params: SamplingParams,
    st: &mut TextState,
) -> Result<Finish, String> {
    let opts = GenerateOptions { max_tokens: req.max_tokens, eos_token_ids: eos.to_vec(), logprobs: req.logprobs };
    // A stop string, the client gone or a decode failure ends the loop after this token.
    let on_token =
        |e: &Emitted| if st.advance(Some(e), false) { ControlFlow::Continue(()) } else { ControlFlow::Break(()) };
    let result = match draft {
        Some(d) if params.is_greedy() => speculative(target, d, &req.prompt, &opts, verify_len, on_token),
        Some(d) => speculative_sampled(target, d, &req.prompt, &opts, verify_len, &params, law, on_token),
        None => sample(target, &req.prompt, &opts, &params, on_token),
    };
    let g = result.map_err(|e| e.to_string())?;
    Ok(Finish {
        stop: g.stop,
        spec: g.spec.as_ref().map(|s| (s.rounds(), s.mean_accepted_length())),
        tokens_per_second: Some(g.decode_tokens_per_second()),
        stats: g.spec,
    })
}

/// How a choice's generation ended, whichever loop ran it.
pub(crate) struct Finish {
    pub(crate) stop: StopReason,
    /// Speculative rounds and mean committed tokens per round.
    pub(crate) spec: Option<(usize, f64)>,
    pub(crate) tokens_per_second: Option<f64>,
    pub(crate) stats: Option<dspark_spec::SpecStats>,
}

/// Sends a choice's end: the held-back text and `Done`, or the error. False when the request
/// must end (an error was sent, or the client is gone).
pub(crate) fn finish_choice(
    st: &mut TextState,
    result: Result<Finish, String>,
    prompt_tokens: usize,
    metrics: &Metrics,
) -> bool {
    let g = match result {
        Ok(g) => g,
        Err(e) => {
            let _ = st.tx.send(Event::Error(e));
            return false;
        }
    };
    if let Some(e) = st.failure.take() {
        let _ = st.tx.send(Event::Error(e));
        return false;
    }
    metrics.generated_tokens.inc_by(st.ids.len() as u64);
    if g.stop == StopReason::Stopped && !st.stopped {
        return false; // the client went away
    }
    // The held-back text (none after a stop string: generation ended inside or at it).
    if !st.stopped && !st.advance(None, true) {
        if let Some(e) = st.failure.take() {
            let _ = st.tx.send(Event::Error(e));
            return false;
        }
        if !st.stopped {
            return false; // the client went away at the very end
        }
    }
    let finish_reason = if st.stopped || g.stop == StopReason::Eos { "stop" } else { "length" };
    if let Some(tps) = g.tokens_per_second {
        metrics.tokens_per_second.set(tps);
    }
    if let Some(s) = &g.stats {
        metrics.record_spec(s);
    }
    let done = Done { finish_reason, prompt_tokens, tokens: std::mem::take(&mut st.ids), spec: g.spec };
    st.tx.send(Event::Done { index: st.index, done }).is_ok()
}
