// Placeholder: the chat page replaces this file.
