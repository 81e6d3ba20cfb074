"""Models of our own: the small reference GPT the demo trains and the tests score with (`gpt`)."""
