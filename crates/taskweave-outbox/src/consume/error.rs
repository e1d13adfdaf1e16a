//! Why a consumer could not start: [`ConsumeError`].

use std::fmt;

use rdkafka::error::KafkaError;

/// Why a consumer could not start.
#[derive(Debug)]
#[non_exhaustive]
pub enum ConsumeError {
    /// librdkafka refused the configuration.
    Config(KafkaError),
    /// The brokers did not answer within the start-up timeout.
    Unreachable {
        /// `bootstrap.servers`.
        brokers: String,
        /// librdkafka's error.
        error: KafkaError,
    },
    /// A topic to consume does not exist.
    UnknownTopic(String),
    /// No topic was given, or `group.id` is missing.
    Invalid(String),
    /// The subscription failed.
    Subscribe(KafkaError),
    /// `start` was not called inside a tokio runtime.
    NoRuntime,
}

impl fmt::Display for ConsumeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Config(error) => write!(f, "the consumer's configuration was refused: {error}"),
            Self::Unreachable { brokers, error } => {
                write!(f, "the Kafka brokers at {brokers} did not answer: {error}")
            }
            Self::UnknownTopic(topic) => write!(f, "topic {topic} does not exist"),
            Self::Invalid(what) => f.write_str(what),
            Self::Subscribe(error) => write!(f, "subscribing failed: {error}"),
            Self::NoRuntime => f.write_str("Consumer::start must be called inside a tokio runtime"),
        }
    }
}

impl std::error::Error for ConsumeError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Config(error) | Self::Subscribe(error) | Self::Unreachable { error, .. } => {
                Some(error)
            }
            _ => None,
        }
    }
}
