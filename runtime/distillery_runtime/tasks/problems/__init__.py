"""The bundled synthetic tasks themselves: problems, reference answers and grading of addition, Fibonacci,
worked-sum, chat-math and tools (with its calculator). Pure, no I/O."""
