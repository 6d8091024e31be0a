from django.core.management.base import BaseCommand

from knowledge.models import EmbeddingModel
from knowledge.services.vectors import configured_spec, kb_reembed


class Command(BaseCommand):
    help = (
        "Embed the whole KB with the configured model (KB_EMBEDDING_*) and switch serving to it. "
        "The previous model keeps serving until every vector of the new one exists."
    )

    def handle(self, *args, **options):
        spec = configured_spec()
        serving = EmbeddingModel.objects.filter(state=EmbeddingModel.State.SERVING).first()
        self.stdout.write(
            f"configured: {spec.name} ({spec.backend}, {spec.dimensions} dims); "
            f"serving now: {serving.name if serving else 'none'}"
        )
        model = kb_reembed(
            progress=lambda n: self.stdout.write(f"  {n} texts embedded", ending="\r")
        )
        self.stdout.write(f"\nserving: {model.name}")
