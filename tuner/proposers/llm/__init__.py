"""What the LLM proposer needs around the API call: the context it reads (hardware, model,
policy, prohibitions, trial history, diagnosis), the tool schemas it answers through, and the
token and dollar cost of each answer. The proposer itself is tuner.proposers.llm.proposer."""
