class Model:
    def execute(self, requests):
        return []
