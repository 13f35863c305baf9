//! Pre-tokenizers of byte-level BPE vocabularies, named by GGUF's `tokenizer.ggml.pre`.
//!
//! A pre-tokenizer cuts text into words before BPE merges run inside each word; using a
//! different one than the model was trained with silently changes token ids. llama.cpp
//! (`llama-vocab.cpp`, `llm_tokenizer_bpe`) describes each as a list of regexes applied in
//! turn: every regex splits every current chunk into matches and the text between matches, and
//! both are kept. That is exactly a sequence of HF `Split(regex, Isolated)` pre-tokenizers,
//! which is what [`PreTokenizerKind::build`] builds, followed by `ByteLevel` without its own
//! regex (it only maps bytes to the GPT-2 alphabet).
//!
//! The regexes are llama.cpp's, except that where llama.cpp rewrote `(?i:'s|'t|...)` as
//! `'[sS]|'[tT]|...` for its own regex engine we keep the original `(?i:...)` of the model's
//! `tokenizer.json` (Oniguruma supports it; the two differ only on exotic case foldings).
//!
//! Unknown names are an error ([`TokenizerError::UnknownPreTokenizer`]), as in llama.cpp; a
//! *missing* `tokenizer.ggml.pre` falls back to llama.cpp's `default` regexes with a warning.

use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{
    OffsetReferential, OffsetType, PreTokenizedString, PreTokenizer, SplitDelimiterBehavior,
};

use crate::error::TokenizerError;

/// GPT-2's regex (also what HF's `ByteLevel(use_regex=true)` uses).
const GPT2: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";

/// Llama 3 (tiktoken cl100k-style): digits in groups of up to three.
const LLAMA3: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Qwen2: like Llama 3 but every digit is its own word.
const QWEN2: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Tekken (Mistral NeMo and later).
const TEKKEN: &str = r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// GPT-4o (o200k), also Llama 4.
const GPT4O: &str = r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// DeepSeek LLM (v1/v2): newlines alone, Latin-ish letter runs, ASCII/fullwidth punctuation
/// runs, trailing whitespace, CJK runs, digit runs.
const DEEPSEEK_LLM: &[&str] = &[
    "[\r\n]",
    concat!(
        "\\s?[",
        "A-Za-z\u{B5}\u{C0}-\u{D6}\u{D8}-\u{F6}\u{F8}-\u{1BA}\u{1BC}-\u{1BF}",
        "\u{1C4}-\u{293}\u{295}-\u{2AF}\u{370}-\u{373}\u{376}\u{377}\u{37B}-\u{37D}",
        "\u{37F}\u{386}\u{388}-\u{38A}\u{38C}\u{38E}-\u{3A1}\u{3A3}-\u{3F5}",
        "\u{3F7}-\u{481}\u{48A}-\u{52F}\u{531}-\u{556}\u{10A0}-\u{10C5}\u{13A0}-\u{13F5}",
        "\u{13F8}-\u{13FD}\u{1C90}-\u{1CBA}\u{1CBD}-\u{1CBF}\u{1D00}-\u{1D2B}",
        "\u{1D6B}-\u{1D77}\u{1D79}-\u{1D9A}\u{1E00}-\u{1F15}\u{1F18}-\u{1F1D}",
        "\u{1F20}-\u{1F45}\u{1F48}-\u{1F4D}\u{1F50}-\u{1F57}\u{1F59}\u{1F5B}\u{1F5D}",
        "\u{1F5F}-\u{1F7D}\u{1F80}-\u{1FB4}\u{1FB6}-\u{1FBC}\u{1FBE}\u{1FC2}-\u{1FC4}",
        "\u{1FC6}-\u{1FCC}\u{1FD0}-\u{1FD3}\u{1FD6}-\u{1FDB}\u{1FE0}-\u{1FEC}",
        "\u{1FF2}-\u{1FF4}\u{1FF6}-\u{1FFC}\u{2102}\u{2107}\u{210A}-\u{2113}\u{2115}",
        "\u{2119}-\u{211D}\u{2124}\u{2126}\u{2128}\u{212A}-\u{212D}\u{212F}-\u{2134}",
        "\u{2139}\u{213C}-\u{213F}\u{2145}-\u{2149}\u{214E}\u{2183}\u{2184}",
        "\u{2C00}-\u{2C7B}\u{2C7E}-\u{2CE4}\u{2CEB}-\u{2CEE}\u{2CF2}\u{2CF3}",
        "\u{A640}-\u{A66D}\u{A680}-\u{A69B}\u{A722}-\u{A76F}\u{A771}-\u{A787}",
        "\u{A78B}-\u{A78E}\u{AB70}-\u{ABBF}\u{FB00}-\u{FB06}\u{FB13}-\u{FB17}",
        "\u{FF21}-\u{FF3A}\u{FF41}-\u{FF5A}\u{10400}-\u{1044F}\u{104B0}-\u{104D3}",
        "\u{104D8}-\u{104FB}\u{10C80}-\u{10CB2}\u{10CC0}-\u{10CF2}\u{118A0}-\u{118DF}",
        "\u{1E900}-\u{1E943}",
        "]+"
    ),
    "\\s?[!-/:-~\u{FF01}-\u{FF0F}\u{FF1A}-\u{FF5E}\u{2018}-\u{201F}\u{3000}-\u{3002}]+",
    r"\s+$",
    "[\u{4E00}-\u{9FA5}\u{800}-\u{4E00}\u{AC00}-\u{D7FF}]+",
    r"\p{N}+",
];

/// DeepSeek Coder.
const DEEPSEEK_CODER: &[&str] = &[
    "[\r\n]",
    r"\s?\p{L}+",
    r"\s?\p{P}+",
    "[\u{4E00}-\u{9FA5}\u{800}-\u{4E00}\u{AC00}-\u{D7FF}]+",
    r"\p{N}",
];

/// DeepSeek V3/R1: digits in groups of up to three, CJK/kana runs, then a letters-with-marks
/// regex in which a single ASCII punctuation character may lead a Latin word.
const DEEPSEEK_V3: &[&str] = &[
    r"\p{N}{1,3}",
    "[\u{4E00}-\u{9FA5}\u{3040}-\u{309F}\u{30A0}-\u{30FF}]+",
    r##"[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"##,
];

/// llama.cpp's `default` (used when `tokenizer.ggml.pre` is missing).
const DEFAULT: &[&str] = &[r"[\p{P}\$\+<=>\^~\|]+", GPT2, r"\p{N}+", "[0-9][0-9][0-9]"];

/// Falcon.
const FALCON: &[&str] = &[r"[\p{P}\$\+<=>\^~\|`]+", GPT2, "[0-9][0-9][0-9]"];

/// A byte-level BPE pre-tokenizer, as llama.cpp groups them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PreTokenizerKind {
    /// llama.cpp's fallback for a vocabulary without `tokenizer.ggml.pre`.
    Default,
    /// GPT-2 and its many reuses (`gpt-2`, `phi-2`, `mpt`, `olmo`, ...).
    Gpt2,
    /// StarCoder-style: every digit alone, then GPT-2 (`starcoder`, `smollm`, `refact`, ...).
    Starcoder,
    /// Llama 3 (`llama-bpe`, `llama3`, `dbrx`, `smaug-bpe`, `falcon3`, ...).
    Llama3,
    /// Qwen2 (`qwen2`, `deepseek-r1-qwen`, `stablelm2`, `megrez`, ...).
    Qwen2,
    DeepseekLlm,
    DeepseekCoder,
    /// DeepSeek V3/R1 (`deepseek-v3`).
    DeepseekV3,
    Falcon,
    /// ChatGLM4 / GLM4 (Llama 3's regex).
    ChatGlm4,
    Tekken,
    /// GPT-4o / Llama 4.
    Gpt4o,
}

impl PreTokenizerKind {
    /// Maps `tokenizer.ggml.pre` to a kind. `None` (the key is absent) is `Default`;
    /// an unknown name is an error.
    pub fn from_gguf_name(name: Option<&str>) -> Result<PreTokenizerKind, TokenizerError> {
        use PreTokenizerKind::*;
        let Some(name) = name else { return Ok(Default) };
        Ok(match name {
            "default" => Default,
            "gpt2" | "gpt-2" | "phi-2" | "mpt" | "olmo" | "jais" | "jina-es" | "jina-de"
            | "jina-v1-en" | "jina-v2-es" | "jina-v2-de" | "jina-v2-code" | "gigachat"
            | "roberta-bpe" | "exaone4" | "trillion" | "mellum" | "modern-bert" | "a.x-4.0"
            | "granite-docling" => Gpt2,
            "starcoder" | "refact" | "command-r" | "smollm" | "codeshell" | "exaone"
            | "minerva-7b" | "mellum2" => Starcoder,
            "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "falcon-h1" | "pixtral"
            | "midm-2.0" | "lfm2" | "dbrx" | "smaug-bpe" | "jina-v5-nano" => Llama3,
            "qwen2" | "deepseek-r1-qwen" | "kormo" | "f2llmv2" | "megrez" | "stablelm2"
            | "hunyuan" | "solar-open" => Qwen2,
            "deepseek-llm" => DeepseekLlm,
            "deepseek-coder" => DeepseekCoder,
            "deepseek-v3" | "hunyuan-dense" | "joyai-llm" => DeepseekV3,
            "falcon" => Falcon,
            "chatglm-bpe" | "glm4" => ChatGlm4,
            "tekken" => Tekken,
            "gpt-4o" | "llama4" | "kanana2" | "minimax-m2" => Gpt4o,
            other => return Err(TokenizerError::UnknownPreTokenizer(other.to_owned())),
        })
    }

    /// The split regexes, applied in order (see the module doc).
    pub fn regexes(self) -> &'static [&'static str] {
        use PreTokenizerKind::*;
        match self {
            Default => DEFAULT,
            Gpt2 => &[GPT2],
            Starcoder => &[r"\p{N}", GPT2],
            Llama3 | ChatGlm4 => &[LLAMA3],
            Qwen2 => &[QWEN2],
            DeepseekLlm => DEEPSEEK_LLM,
            DeepseekCoder => DEEPSEEK_CODER,
            DeepseekV3 => DEEPSEEK_V3,
            Falcon => FALCON,
            Tekken => &[TEKKEN],
            Gpt4o => &[GPT4O],
        }
    }

    /// Whether a word that is itself a token skips the merges (HF `ignore_merges`, llama.cpp
    /// `ignore_merges`): set for Llama 3 and Tekken, whose merges do not reproduce every token.
    pub fn ignore_merges(self) -> bool {
        matches!(self, PreTokenizerKind::Llama3 | PreTokenizerKind::Tekken)
    }

    /// llama.cpp's default for `add_bos` when the file does not say.
    pub fn default_add_bos(self) -> bool {
        matches!(self, PreTokenizerKind::Llama3 | PreTokenizerKind::Tekken)
    }

    fn split_steps(self) -> Result<Vec<PreTokenizerWrapper>, TokenizerError> {
        self.regexes()
            .iter()
            .map(|re| {
                Split::new(
                    SplitPattern::Regex((*re).to_owned()),
                    SplitDelimiterBehavior::Isolated,
                    false,
                )
                .map(PreTokenizerWrapper::Split)
                .map_err(|e| TokenizerError::Tokenizers(format!("pre-tokenizer regex {re:?}: {e}")))
            })
            .collect()
    }

    /// The splitting part alone (no byte mapping): for tests and debugging.
    pub fn splitter(self) -> Result<PreTokenizerWrapper, TokenizerError> {
        Ok(PreTokenizerWrapper::Sequence(Sequence::new(
            self.split_steps()?,
        )))
    }

    /// The full pre-tokenizer: the splits, then the GPT-2 byte mapping.
    pub fn build(self) -> Result<PreTokenizerWrapper, TokenizerError> {
        let mut steps = self.split_steps()?;
        steps.push(PreTokenizerWrapper::ByteLevel(ByteLevel::new(
            false, true, false,
        )));
        Ok(PreTokenizerWrapper::Sequence(Sequence::new(steps)))
    }

    /// Splits `text` into words (plain text, before the byte mapping).
    pub fn split(self, text: &str) -> Result<Vec<String>, TokenizerError> {
        let mut pre = PreTokenizedString::from(text);
        self.splitter()?.pre_tokenize(&mut pre)?;
        Ok(pre
            .get_splits(OffsetReferential::Original, OffsetType::Byte)
            .into_iter()
            .map(|(s, _, _)| s.to_owned())
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::PreTokenizerKind::{self, *};

    fn split(kind: PreTokenizerKind, text: &str) -> Vec<String> {
        kind.split(text).unwrap()
    }

    #[test]
    fn every_kind_compiles() {
        for kind in [
            Default,
            Gpt2,
            Starcoder,
            Llama3,
            Qwen2,
            DeepseekLlm,
            DeepseekCoder,
            DeepseekV3,
            Falcon,
            ChatGlm4,
            Tekken,
            Gpt4o,
        ] {
            kind.build().unwrap();
            // Splitting never loses or invents text.
            let text = "Hello, World! 12345 I'm here\n\n  日本語テキスト 👋🏽 x=1+2";
            assert_eq!(split(kind, text).concat(), text, "{kind:?}");
        }
    }

    #[test]
    fn names() {
        assert_eq!(
            PreTokenizerKind::from_gguf_name(Some("smollm")).unwrap(),
            Starcoder
        );
        assert_eq!(
            PreTokenizerKind::from_gguf_name(Some("llama-bpe")).unwrap(),
            Llama3
        );
        assert_eq!(
            PreTokenizerKind::from_gguf_name(Some("qwen2")).unwrap(),
            Qwen2
        );
        assert_eq!(
            PreTokenizerKind::from_gguf_name(Some("deepseek-v3")).unwrap(),
            DeepseekV3
        );
        assert_eq!(PreTokenizerKind::from_gguf_name(None).unwrap(), Default);
        assert!(matches!(
            PreTokenizerKind::from_gguf_name(Some("no-such-pre")),
            Err(crate::TokenizerError::UnknownPreTokenizer(n)) if n == "no-such-pre"
        ));
    }

    #[test]
    fn digit_grouping_differs() {
        let t = "pay 1234567 now";
        assert_eq!(split(Gpt2, t), ["pay", " 1234567", " now"]);
        assert_eq!(
            split(Starcoder, t),
            ["pay", " ", "1", "2", "3", "4", "5", "6", "7", " now"]
        );
        assert_eq!(split(Llama3, t), ["pay", " ", "123", "456", "7", " now"]);
        assert_eq!(
            split(Qwen2, t),
            ["pay", " ", "1", "2", "3", "4", "5", "6", "7", " now"]
        );
        assert_eq!(split(DeepseekLlm, t), ["pay", " ", "1234567", " now"]);
        assert_eq!(
            split(DeepseekV3, t),
            ["pay", " ", "123", "456", "7", " now"]
        );
    }

    #[test]
    fn contractions_differ() {
        // GPT-2 is case-sensitive about contractions; Llama 3 and Qwen2 are not.
        assert_eq!(split(Gpt2, "I'M here"), ["I", "'", "M", " here"]);
        assert_eq!(split(Llama3, "I'M here"), ["I", "'M", " here"]);
        assert_eq!(split(Qwen2, "I'M here"), ["I", "'M", " here"]);
        assert_eq!(split(Gpt2, "we're"), ["we", "'re"]);
        // DeepSeek V3 lets one ASCII punctuation character lead a Latin word.
        assert_eq!(split(DeepseekV3, "we're"), ["we", "'re"]);
        assert_eq!(split(DeepseekV3, "a.b"), ["a", ".b"]);
        assert_eq!(split(Llama3, "a.b"), ["a", ".b"]);
        assert_eq!(split(Gpt2, "a.b"), ["a", ".", "b"]);
    }

    #[test]
    fn cjk_differs() {
        let t = "日本語テキスト です";
        // GPT-2: letters are letters.
        assert_eq!(split(Gpt2, t), ["日本語テキスト", " です"]);
        // DeepSeek V3: a CJK+kana run is its own word, its leading space is split off.
        assert_eq!(split(DeepseekV3, t), ["日本語テキスト", " ", "です"]);
        // DeepSeek LLM: Latin letters and CJK (U+0800..U+9FA5, Hangul) are separate runs.
        assert_eq!(split(Gpt2, "abc日本"), ["abc日本"]);
        assert_eq!(split(DeepseekLlm, "abc日本"), ["abc", "日本"]);
    }

    #[test]
    fn newlines_and_spaces() {
        let t = "a\n\n  b   \n";
        assert_eq!(split(Gpt2, t), ["a", "\n\n ", " b", "   \n"]);
        assert_eq!(split(Llama3, t), ["a", "\n\n", " ", " b", "   \n"]);
        assert_eq!(split(DeepseekLlm, "a\nb"), ["a", "\n", "b"]);
    }
}
