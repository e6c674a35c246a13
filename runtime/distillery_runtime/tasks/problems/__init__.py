"""The bundled synthetic tasks themselves: problems, reference answers and grading of addition, Fibonacci,
worked-sum and chat-math. Pure, no I/O."""
