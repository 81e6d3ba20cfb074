"""Built-in task families, one module each, and the `LetterKeys` mixin for letter-key formats.
Importing a module registers its task ids."""
