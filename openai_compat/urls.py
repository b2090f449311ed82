from django.urls import path

from . import api

# No trailing slashes: OpenAI's clients append these paths to a base URL as they are.
urlpatterns = [
    path("chat/completions", api.ChatCompletionView.as_view(), name="openai-chat-completions"),
    path("models", api.ModelListView.as_view(), name="openai-models"),
    path("models/<str:model>", api.ModelDetailView.as_view(), name="openai-model"),
]
